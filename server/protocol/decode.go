package protocol

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Params are the params of one method: DecodeParams fills them from a
// request, and Validate checks what decoding cannot (required fields,
// ranges, which tool needs which field).
type Params interface {
	// Validate returns nil or an invalid_params *Error naming every bad
	// field.
	Validate() error
	check(c *checker)
}

// DecodeParams decodes a request's raw params map (nil: none) into p and
// validates it. A field is read by its msgpack tag with the protocol's
// rules rather than msgpack's: a string takes str or bin (clients send
// bytes), an integer takes any msgpack integer or a float without
// fraction, a number must be finite, nil is absent, and a field the type
// does not have is ignored (later versions may add fields). Every
// problem, of type or of value, goes into one invalid_params error.
func DecodeParams(raw msgpack.RawMessage, p Params) error {
	c := newChecker()
	if len(raw) > 0 {
		d := msgpack.NewDecoder(bytes.NewReader(raw))
		if err := c.decode(d, reflect.ValueOf(p).Elem(), ""); err != nil {
			return Errorf(CodeInvalidParams, "params: %v", err)
		}
	}
	p.check(c)
	return c.err()
}

// checker collects the problems of one request's params, one per field
// at most: a field that did not decode is not also reported missing.
type checker struct {
	path  string // prefix of field names: "items[2].action."
	probs *[]string
	bad   *map[string]bool // made at the first problem
}

func newChecker() *checker { return &checker{probs: new([]string), bad: new(map[string]bool)} }

// sub is the checker of a nested map or array element.
func (c *checker) sub(name string) *checker {
	return &checker{path: c.path + name + ".", probs: c.probs, bad: c.bad}
}

// fail records a problem of the named field ("" for the request as a
// whole).
func (c *checker) fail(field, format string, args ...any) {
	name := strings.TrimSuffix(c.path+field, ".")
	for i := range len(name) + 1 {
		if (i == len(name) || name[i] == '.' || name[i] == '[') && c.isBad(name[:i]) {
			return // that field, or the map or array holding it, is reported
		}
	}
	if *c.bad == nil {
		*c.bad = map[string]bool{}
	}
	(*c.bad)[name] = true
	if name != "" {
		name += ": "
	}
	*c.probs = append(*c.probs, name+fmt.Sprintf(format, args...))
}

func (c *checker) isBad(name string) bool { return (*c.bad)[name] }

// ok reports whether no problem was found so far; checks of the request
// as a whole (one of two fields) run only on fields that are each fine.
func (c *checker) ok() bool { return len(*c.probs) == 0 }

// required fails a string field that is missing or empty.
func (c *checker) required(field, v string) {
	if v == "" {
		c.fail(field, "required string is missing")
	}
}

func (c *checker) err() error {
	if len(*c.probs) == 0 {
		return nil
	}
	return Errorf(CodeInvalidParams, "%s", strings.Join(*c.probs, "; "))
}

// typeName names the msgpack type of code c, as error messages say it.
func typeName(c byte) string {
	switch {
	case c == msgpcode.Nil:
		return "nil"
	case c == msgpcode.True || c == msgpcode.False:
		return "bool"
	case msgpcode.IsFixedNum(c), c >= msgpcode.Uint8 && c <= msgpcode.Int64:
		return "integer"
	case c == msgpcode.Float || c == msgpcode.Double:
		return "float"
	case msgpcode.IsString(c):
		return "string"
	case msgpcode.IsBin(c):
		return "binary"
	case msgpcode.IsFixedArray(c), c == msgpcode.Array16, c == msgpcode.Array32:
		return "array"
	case msgpcode.IsFixedMap(c), c == msgpcode.Map16, c == msgpcode.Map32:
		return "map"
	}
	return fmt.Sprintf("code 0x%02x", c)
}

func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c >= msgpcode.Uint8 && c <= msgpcode.Int64
}

func isFloat(c byte) bool { return c == msgpcode.Float || c == msgpcode.Double }

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

// readNumber reads a msgpack integer or float as both an int64 (the
// float truncated) and a float64; a uint64 over MaxInt64 comes out
// negative as an int64.
func readNumber(d *msgpack.Decoder, code byte) (int64, float64, error) {
	switch {
	case isFloat(code):
		f, err := d.DecodeFloat64()
		return int64(f), f, err
	case code == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		return int64(u), float64(u), err
	}
	n, err := d.DecodeInt64()
	return n, float64(n), err
}

// field is one msgpack-tagged field of a params struct.
type field struct {
	name  string
	index int
}

// fields caches fieldsOf by type.
var fields sync.Map // reflect.Type -> []field

func fieldsOf(t reflect.Type) []field {
	if fs, ok := fields.Load(t); ok {
		return fs.([]field)
	}
	var fs []field
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("msgpack"), ",")
		if name == "" || name == "-" || !sf.IsExported() {
			continue
		}
		fs = append(fs, field{name, i})
	}
	fields.Store(t, fs)
	return fs
}

// decode reads the next value into v, the field called name (its full
// path, for messages). A value of the wrong type is skipped and recorded;
// the error returned is the msgpack stream's own (truncated, which a
// frame that passed Validate never is).
func (c *checker) decode(d *msgpack.Decoder, v reflect.Value, name string) error {
	code, err := d.PeekCode()
	if err != nil {
		return err
	}
	if code == msgpcode.Nil && name != "" {
		return d.Skip() // absent
	}
	wrong := func(want string) error {
		c.fail(name, "want %s, got %s", want, typeName(code))
		return d.Skip()
	}
	switch v.Kind() {
	case reflect.String:
		if !msgpcode.IsString(code) && !msgpcode.IsBin(code) {
			return wrong("string")
		}
		s, err := d.DecodeString()
		v.SetString(s)
		return err
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			if !msgpcode.IsString(code) && !msgpcode.IsBin(code) {
				return wrong("binary or string")
			}
			b, err := d.DecodeBytes()
			v.SetBytes(b)
			return err
		}
		if !isArray(code) {
			return wrong("array")
		}
		n, err := d.DecodeArrayLen()
		if err != nil {
			return err
		}
		s := reflect.MakeSlice(v.Type(), n, n)
		for i := range n {
			if err := c.decode(d, s.Index(i), fmt.Sprintf("%s[%d]", name, i)); err != nil {
				return err
			}
		}
		v.Set(s)
		return nil
	case reflect.Int, reflect.Int64:
		if !isInt(code) && !isFloat(code) {
			return wrong("integer")
		}
		n, f, err := readNumber(d, code)
		if err != nil {
			return err
		}
		switch {
		case isFloat(code) && (f != math.Trunc(f) || math.Abs(f) >= 1<<53):
			c.fail(name, "want integer, got float %v", f)
		case code == msgpcode.Uint64 && n < 0, v.OverflowInt(n):
			c.fail(name, "integer out of range")
		default:
			v.SetInt(n)
		}
		return nil
	case reflect.Bool:
		if code != msgpcode.True && code != msgpcode.False {
			return wrong("bool")
		}
		b, err := d.DecodeBool()
		v.SetBool(b)
		return err
	case reflect.Float64:
		if !isInt(code) && !isFloat(code) {
			return wrong("number")
		}
		_, f, err := readNumber(d, code)
		if err != nil {
			return err
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			c.fail(name, "want a finite number")
			return nil
		}
		v.SetFloat(f)
		return nil
	case reflect.Pointer:
		e := reflect.New(v.Type().Elem())
		if err := c.decode(d, e.Elem(), name); err != nil {
			return err
		}
		if !c.isBad(name) {
			v.Set(e)
		}
		return nil
	case reflect.Map:
		// Accepted as it is (reset.options): msgpack's own decoding.
		if !isMap(code) {
			return wrong("map")
		}
		m := reflect.New(v.Type())
		if err := d.DecodeValue(m.Elem()); err != nil {
			return err
		}
		v.Set(m.Elem())
		return nil
	case reflect.Struct:
		if !isMap(code) {
			return wrong("map")
		}
		n, err := d.DecodeMapLen()
		if err != nil {
			return err
		}
		fs := fieldsOf(v.Type())
		prefix := name
		if prefix != "" {
			prefix += "."
		}
	keys:
		for range n {
			key, err := d.DecodeString()
			if err != nil {
				return err
			}
			for _, f := range fs {
				if f.name == key {
					if err := c.decode(d, v.Field(f.index), prefix+key); err != nil {
						return err
					}
					continue keys
				}
			}
			if err := d.Skip(); err != nil { // a field of a later version
				return err
			}
		}
		return nil
	}
	panic(fmt.Sprintf("protocol: params field %s of kind %s has no decoding rule", name, v.Kind()))
}

package server

import (
	"fmt"
	"math"
	"strings"

	"github.com/arbor-env/arbor/server/protocol"
)

// params reads typed fields from a request's params map, collecting every
// problem so that one error names them all.
type params struct {
	m    map[string]any
	path string
	errs *[]string
}

func newParams(m map[string]any) *params { return &params{m: m, errs: new([]string)} }

func (p *params) fail(key, format string, args ...any) {
	*p.errs = append(*p.errs, p.path+key+": "+fmt.Sprintf(format, args...))
}

// err is the invalid_params error, or nil.
func (p *params) err() error {
	if len(*p.errs) == 0 {
		return nil
	}
	return protocol.Errorf(protocol.CodeInvalidParams, "%s", strings.Join(*p.errs, "; "))
}

func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "nil"
	case string:
		return "string"
	case []byte:
		return "binary"
	case bool:
		return "bool"
	case float32, float64:
		return "float"
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64, int, uint:
		return "integer"
	case map[string]any:
		return "map"
	case []any:
		return "array"
	default:
		return fmt.Sprintf("%T", v)
	}
}

func (p *params) has(key string) bool {
	v, ok := p.m[key]
	return ok && v != nil
}

// str reads a string (str or bin).
func (p *params) str(key string, required bool) string {
	v, ok := p.m[key]
	if !ok || v == nil {
		if required {
			p.fail(key, "required string is missing")
		}
		return ""
	}
	switch s := v.(type) {
	case string:
		return s
	case []byte:
		return string(s)
	}
	p.fail(key, "want string, got %s", typeName(v))
	return ""
}

// bytes reads bytes (bin or str); missing is empty.
func (p *params) bytes(key string) []byte {
	switch s := p.m[key].(type) {
	case nil:
		return nil
	case []byte:
		return s
	case string:
		return []byte(s)
	}
	p.fail(key, "want binary or string, got %s", typeName(p.m[key]))
	return nil
}

func toInt64(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n > math.MaxInt64 {
			return 0, false
		}
		return int64(n), true
	case float64:
		if n == math.Trunc(n) && math.Abs(n) < 1<<53 {
			return int64(n), true
		}
	case float32:
		return toInt64(float64(n))
	}
	return 0, false
}

// int64 reads an integer (a float with no fraction is accepted).
func (p *params) int64(key string, required bool, def int64) int64 {
	v, ok := p.m[key]
	if !ok || v == nil {
		if required {
			p.fail(key, "required integer is missing")
		}
		return def
	}
	n, ok := toInt64(v)
	if !ok {
		p.fail(key, "want integer, got %s", typeName(v))
		return def
	}
	return n
}

// float reads a number.
func (p *params) float(key string, def float64) float64 {
	v, ok := p.m[key]
	if !ok || v == nil {
		return def
	}
	switch n := v.(type) {
	case float64:
		if math.IsNaN(n) || math.IsInf(n, 0) {
			p.fail(key, "want a finite number")
			return def
		}
		return n
	case float32:
		return float64(n)
	}
	if n, ok := toInt64(v); ok {
		return float64(n)
	}
	p.fail(key, "want number, got %s", typeName(v))
	return def
}

// sub reads a nested map; missing gives an empty one.
func (p *params) sub(key string, required bool) *params {
	v, ok := p.m[key]
	if !ok || v == nil {
		if required {
			p.fail(key, "required map is missing")
		}
		return &params{m: map[string]any{}, path: p.path + key + ".", errs: p.errs}
	}
	m, ok := v.(map[string]any)
	if !ok {
		p.fail(key, "want map, got %s", typeName(v))
		m = map[string]any{}
	}
	return &params{m: m, path: p.path + key + ".", errs: p.errs}
}

// list reads an array.
func (p *params) list(key string, required bool) []any {
	v, ok := p.m[key]
	if !ok || v == nil {
		if required {
			p.fail(key, "required array is missing")
		}
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		p.fail(key, "want array, got %s", typeName(v))
	}
	return l
}

// action reads a step action.
func (p *params) action(key string) protocol.Action {
	a := p.sub(key, true)
	act := protocol.Action{Tool: a.str("tool", true)}
	switch act.Tool {
	case protocol.ToolBash:
		act.Cmd = a.str("cmd", true)
		act.TimeoutS = a.float("timeout_s", 0)
		if act.TimeoutS < 0 {
			a.fail("timeout_s", "must not be negative")
		}
	case protocol.ToolWriteFile:
		act.Path = a.str("path", true)
		act.Content = a.bytes("content")
	case protocol.ToolReadFile:
		act.Path = a.str("path", true)
	case protocol.ToolRollback:
		act.StateID = a.str("state_id", true)
	case "":
	default:
		a.fail("tool", "unknown tool %q (want one of %s)", act.Tool, strings.Join(protocol.Tools, ", "))
	}
	if (act.Tool == protocol.ToolWriteFile || act.Tool == protocol.ToolReadFile) && act.Path == "" && a.has("path") {
		a.fail("path", "must not be empty")
	}
	act.MaxOutput = int(a.int64("max_output", false, 0))
	if act.MaxOutput < 0 {
		a.fail("max_output", "must not be negative")
	}
	return act
}

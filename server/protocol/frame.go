package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Message types of msgpack-rpc.
const (
	Request      = 0
	Response     = 1
	Notification = 2
)

// MaxDepth bounds the nesting of arrays and maps in a frame, so a hostile
// frame cannot make the decoder recurse without end.
const MaxDepth = 32

// ErrFrame is wrapped by every frame decoding failure.
var ErrFrame = errors.New("malformed frame")

// Frame is one decoded msgpack-rpc message.
//
//	request      [0, msgid, method, [params]]
//	response     [1, msgid, error, result]
//	notification [2, method, [params]]
type Frame struct {
	Type   int
	MsgID  uint32
	Method string
	// Params is the raw params map of a request or notification (nil when
	// the params array was empty or held nil): DecodeParams reads it.
	Params msgpack.RawMessage
	// Error and Result belong to a response; Result is raw so that the
	// caller decodes it into the type it expects.
	Error  *Error
	Result msgpack.RawMessage
}

// DecodeFrame decodes one message. It checks the whole frame's structure
// first (well-formed, no trailing bytes, nesting at most MaxDepth, every
// length within the frame, no ext types), so the decoder never allocates
// for lengths the frame does not hold.
func DecodeFrame(b []byte) (Frame, error) {
	var f Frame
	if err := Validate(b, MaxDepth); err != nil {
		return f, err
	}
	d := msgpack.NewDecoder(bytes.NewReader(b))
	n, err := d.DecodeArrayLen()
	if err != nil {
		return f, fmt.Errorf("%w: want an array: %v", ErrFrame, err)
	}
	if n < 3 || n > 4 {
		return f, fmt.Errorf("%w: array of %d elements, want 3 or 4", ErrFrame, n)
	}
	t, err := d.DecodeInt()
	if err != nil {
		return f, fmt.Errorf("%w: message type: %v", ErrFrame, err)
	}
	f.Type = t
	switch t {
	case Request:
		if n != 4 {
			return f, fmt.Errorf("%w: request has %d elements, want 4", ErrFrame, n)
		}
		if f.MsgID, err = decodeMsgID(d); err != nil {
			return f, err
		}
		if f.Method, err = decodeMethod(d); err != nil {
			return f, err
		}
		f.Params, err = decodeParams(d)
		return f, err
	case Notification:
		if n != 3 {
			return f, fmt.Errorf("%w: notification has %d elements, want 3", ErrFrame, n)
		}
		if f.Method, err = decodeMethod(d); err != nil {
			return f, err
		}
		f.Params, err = decodeParams(d)
		return f, err
	case Response:
		if n != 4 {
			return f, fmt.Errorf("%w: response has %d elements, want 4", ErrFrame, n)
		}
		if f.MsgID, err = decodeMsgID(d); err != nil {
			return f, err
		}
		raw, err := d.DecodeRaw()
		if err != nil {
			return f, fmt.Errorf("%w: error: %v", ErrFrame, err)
		}
		if !isNil(raw) {
			f.Error = &Error{}
			if err := msgpack.Unmarshal(raw, f.Error); err != nil {
				return f, fmt.Errorf("%w: error object: %v", ErrFrame, err)
			}
		}
		if f.Result, err = d.DecodeRaw(); err != nil {
			return f, fmt.Errorf("%w: result: %v", ErrFrame, err)
		}
		return f, nil
	default:
		return f, fmt.Errorf("%w: message type %d", ErrFrame, t)
	}
}

func isNil(raw msgpack.RawMessage) bool { return len(raw) == 1 && raw[0] == 0xc0 }

func decodeMsgID(d *msgpack.Decoder) (uint32, error) {
	v, err := d.DecodeInt64()
	if err != nil {
		return 0, fmt.Errorf("%w: msgid: %v", ErrFrame, err)
	}
	if v < 0 || v > 1<<32-1 {
		return 0, fmt.Errorf("%w: msgid %d out of uint32 range", ErrFrame, v)
	}
	return uint32(v), nil
}

func decodeMethod(d *msgpack.Decoder) (string, error) {
	m, err := d.DecodeString()
	if err != nil {
		return "", fmt.Errorf("%w: method: %v", ErrFrame, err)
	}
	return m, nil
}

// decodeParams reads the params array: empty, [nil] or [map]. (Validate
// has checked that every map key is a string.)
func decodeParams(d *msgpack.Decoder) (msgpack.RawMessage, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("%w: params must be an array: %v", ErrFrame, err)
	}
	switch {
	case n <= 0:
		return nil, nil
	case n > 1:
		return nil, fmt.Errorf("%w: params array has %d elements, want one map", ErrFrame, n)
	}
	raw, err := d.DecodeRaw()
	if err != nil {
		return nil, fmt.Errorf("%w: params: %v", ErrFrame, err)
	}
	if isNil(raw) {
		return nil, nil
	}
	if c := raw[0]; !(c >= 0x80 && c <= 0x8f) && c != 0xde && c != 0xdf {
		return nil, fmt.Errorf("%w: params[0] must be a map", ErrFrame)
	}
	return raw, nil
}

// PeekRequest reads the msgid and method from the start of a request that
// may be cut short (a frame over the size limit), so that the error can be
// addressed to it. ok is false when the prefix does not hold them.
func PeekRequest(prefix []byte) (msgid uint32, method string, ok bool) {
	d := msgpack.NewDecoder(bytes.NewReader(prefix))
	if n, err := d.DecodeArrayLen(); err != nil || n != 4 {
		return 0, "", false
	}
	if t, err := d.DecodeInt(); err != nil || t != Request {
		return 0, "", false
	}
	id, err := decodeMsgID(d)
	if err != nil {
		return 0, "", false
	}
	// The method name is short; refuse to trust a huge declared length.
	if len(prefix) > 0 {
		if m, err := d.DecodeString(); err == nil && len(m) <= 64 {
			method = m
		}
	}
	return id, method, true
}

// Validate checks that b is exactly one well-formed msgpack object nested at
// most maxDepth deep, whose every declared length fits in b, whose map keys
// are all strings (str or bin) and which uses no ext types. It allocates
// nothing per element.
func Validate(b []byte, maxDepth int) error {
	// pending[i] is how many objects are still due at depth i; in a map
	// (pairs), the key is due when the count is even.
	type level struct {
		n     int
		pairs bool
	}
	pending := make([]level, 1, 8)
	pending[0].n = 1
	i := 0
	for len(pending) > 0 {
		top := &pending[len(pending)-1]
		if top.n == 0 {
			pending = pending[:len(pending)-1]
			continue
		}
		key := top.pairs && top.n%2 == 0
		top.n--
		if i >= len(b) {
			return fmt.Errorf("%w: truncated at byte %d", ErrFrame, i)
		}
		c := b[i]
		i++
		if key && !(c >= 0xa0 && c <= 0xbf || c >= 0xd9 && c <= 0xdb || c >= 0xc4 && c <= 0xc6) {
			return fmt.Errorf("%w: map key at byte %d is not a string", ErrFrame, i-1)
		}
		var skip, count int // bytes to skip; objects that follow (containers)
		var lenBytes int    // size of a big-endian length that follows
		container, pairs := false, false
		switch {
		case c <= 0x7f, c >= 0xe0, c == 0xc0, c == 0xc2, c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			container, pairs, count = true, true, int(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			container, count = true, int(c&0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = int(c & 0x1f)
		case c == 0xc4 || c == 0xd9:
			lenBytes = 1
		case c == 0xc5 || c == 0xda:
			lenBytes = 2
		case c == 0xc6 || c == 0xdb:
			lenBytes = 4
		case c == 0xca:
			skip = 4
		case c == 0xcb:
			skip = 8
		case c == 0xcc || c == 0xd0:
			skip = 1
		case c == 0xcd || c == 0xd1:
			skip = 2
		case c == 0xce || c == 0xd2:
			skip = 4
		case c == 0xcf || c == 0xd3:
			skip = 8
		case c == 0xdc:
			container, lenBytes = true, 2
		case c == 0xdd:
			container, lenBytes = true, 4
		case c == 0xde:
			container, pairs, lenBytes = true, true, 2
		case c == 0xdf:
			container, pairs, lenBytes = true, true, 4
		case c == 0xc1:
			return fmt.Errorf("%w: byte 0xc1 at %d is never used in msgpack", ErrFrame, i-1)
		default: // 0xc7-0xc9, 0xd4-0xd8: ext types
			return fmt.Errorf("%w: ext type 0x%02x at byte %d is not used by the protocol", ErrFrame, c, i-1)
		}
		if lenBytes > 0 {
			if len(b)-i < lenBytes {
				return fmt.Errorf("%w: truncated length at byte %d", ErrFrame, i)
			}
			var n uint64
			switch lenBytes {
			case 1:
				n = uint64(b[i])
			case 2:
				n = uint64(binary.BigEndian.Uint16(b[i:]))
			case 4:
				n = uint64(binary.BigEndian.Uint32(b[i:]))
			}
			i += lenBytes
			if n > uint64(len(b)) {
				return fmt.Errorf("%w: length %d at byte %d exceeds the frame", ErrFrame, n, i)
			}
			if container {
				count = int(n)
			} else {
				skip = int(n)
			}
		}
		if skip > len(b)-i {
			return fmt.Errorf("%w: truncated at byte %d", ErrFrame, i)
		}
		i += skip
		if container {
			if pairs {
				count *= 2
			}
			// Every object takes at least one byte.
			if count > len(b)-i {
				return fmt.Errorf("%w: %d elements declared at byte %d, the frame has %d bytes left", ErrFrame, count, i, len(b)-i)
			}
			if count > 0 {
				if len(pending) > maxDepth {
					return fmt.Errorf("%w: nested deeper than %d", ErrFrame, maxDepth)
				}
				pending = append(pending, level{count, pairs})
			}
		}
	}
	if i != len(b) {
		return fmt.Errorf("%w: %d trailing bytes", ErrFrame, len(b)-i)
	}
	return nil
}

// EncodeRequest encodes [0, msgid, method, [params]]; nil params encode as
// an empty array.
func EncodeRequest(msgid uint32, method string, params any) ([]byte, error) {
	p := []any{}
	if params != nil {
		p = []any{params}
	}
	return marshal([]any{Request, msgid, method, p})
}

// EncodeResponse encodes [1, msgid, error, result].
func EncodeResponse(msgid uint32, e *Error, result any) ([]byte, error) {
	var ev any
	if e != nil {
		ev = e
		result = nil
	}
	return marshal([]any{Response, msgid, ev, result})
}

// EncodeNotification encodes [2, method, [params]].
func EncodeNotification(method string, params any) ([]byte, error) {
	return marshal([]any{Notification, method, []any{params}})
}

func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	enc.UseCompactFloats(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

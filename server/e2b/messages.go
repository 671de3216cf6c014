package e2b

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// The messages of envd's Connect services, in the proto3 JSON mapping the
// SDK speaks (its transport uses JSON, never the binary format): written
// from the public definitions of process.proto and filesystem.proto
// (package process, package filesystem), field names in lowerCamelCase,
// 64-bit integers as strings, bytes as base64, enums by name, a oneof as
// the one field set. jsonCodec carries them; the binary codec is not
// served. TestDescriptors holds each to the descriptor the pinned SDK
// embeds (field names, JSON names, types), so a drift fails a test.

// jsonCodec is connect's "json" codec over encoding/json and the structs
// below.
type jsonCodec struct{}

func (jsonCodec) Name() string { return "json" }

func (jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

func (jsonCodec) Unmarshal(b []byte, v any) error {
	if len(b) == 0 {
		return nil
	}
	return json.Unmarshal(b, v)
}

// uint32s is a proto3 uint32 (a JSON number, or a string of one).
type uint32s uint32

func (u *uint32s) UnmarshalJSON(b []byte) error {
	s := string(b)
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return fmt.Errorf("decode uint32 %s: %w", b, err)
	}
	*u = uint32s(n)
	return nil
}

// int64s is a proto3 int64: a string in JSON, a number accepted.
type int64s int64

func (i int64s) MarshalJSON() ([]byte, error) {
	return []byte(`"` + strconv.FormatInt(int64(i), 10) + `"`), nil
}

func (i *int64s) UnmarshalJSON(b []byte) error {
	s := string(b)
	if uq, err := strconv.Unquote(s); err == nil {
		s = uq
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("decode int64 %s: %w", b, err)
	}
	*i = int64s(n)
	return nil
}

// signal is process.Signal: by name or by number.
type signal int32

const (
	sigUnspecified signal = 0
	sigKill        signal = 9
	sigTerm        signal = 15
)

func (s *signal) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case `"SIGNAL_SIGKILL"`, "9":
		*s = sigKill
	case `"SIGNAL_SIGTERM"`, "15":
		*s = sigTerm
	case `"SIGNAL_UNSPECIFIED"`, "0":
		*s = sigUnspecified
	default:
		return fmt.Errorf("decode signal %s: unknown", b)
	}
	return nil
}

// process.proto

type processConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type processSelector struct {
	Pid *uint32s `json:"pid,omitempty"`
	Tag *string  `json:"tag,omitempty"`
}

type startRequest struct {
	Process *processConfig  `json:"process"`
	Pty     json.RawMessage `json:"pty,omitempty"`
	Tag     *string         `json:"tag,omitempty"`
	Stdin   *bool           `json:"stdin,omitempty"`
}

type startEvent struct {
	Pid uint32 `json:"pid"`
}

type dataEvent struct {
	Stdout []byte `json:"stdout,omitempty"`
	Stderr []byte `json:"stderr,omitempty"`
}

type endEvent struct {
	ExitCode int32   `json:"exitCode"`
	Exited   bool    `json:"exited"`
	Status   string  `json:"status"`
	Error    *string `json:"error,omitempty"`
}

type keepAlive struct{}

type processEvent struct {
	Start     *startEvent `json:"start,omitempty"`
	Data      *dataEvent  `json:"data,omitempty"`
	End       *endEvent   `json:"end,omitempty"`
	Keepalive *keepAlive  `json:"keepalive,omitempty"`
}

type startResponse struct {
	Event processEvent `json:"event"`
}

type listRequest struct{}

type processInfo struct {
	Config processConfig `json:"config"`
	Pid    uint32        `json:"pid"`
	Tag    *string       `json:"tag,omitempty"`
}

type listResponse struct {
	Processes []processInfo `json:"processes"`
}

type sendSignalRequest struct {
	Process processSelector `json:"process"`
	Signal  signal          `json:"signal"`
}

type sendSignalResponse struct{}

type connectRequest struct {
	Process processSelector `json:"process"`
}

// anyMessage stands for the requests of the calls not served: they are
// answered unimplemented before their body matters.
type anyMessage struct{}

// filesystem.proto

type fileType string

const (
	fileTypeFile    fileType = "FILE_TYPE_FILE"
	fileTypeDir     fileType = "FILE_TYPE_DIRECTORY"
	fileTypeSymlink fileType = "FILE_TYPE_SYMLINK"
	fileTypeOther   fileType = "FILE_TYPE_UNSPECIFIED"
)

type entryInfo struct {
	Name          string    `json:"name"`
	Type          fileType  `json:"type"`
	Path          string    `json:"path"`
	Size          int64s    `json:"size"`
	Mode          uint32    `json:"mode"`
	Permissions   string    `json:"permissions"`
	Owner         string    `json:"owner"`
	Group         string    `json:"group"`
	ModifiedTime  time.Time `json:"modifiedTime"`
	SymlinkTarget *string   `json:"symlinkTarget,omitempty"`
}

type pathRequest struct {
	Path string `json:"path"`
}

type listDirRequest struct {
	Path  string  `json:"path"`
	Depth uint32s `json:"depth"`
}

type moveRequest struct {
	Source      string `json:"source"`
	Destination string `json:"destination"`
}

type entryResponse struct {
	Entry entryInfo `json:"entry"`
}

type listDirResponse struct {
	Entries []entryInfo `json:"entries"`
}

type emptyResponse struct{}

package e2b

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/arbor-env/arbor/state"
)

func TestShellCommand(t *testing.T) {
	cwd := "/tmp/a b"
	tests := []struct {
		name string
		p    *processConfig
		want string
		err  bool
	}{
		{"the SDK's bash -l -c", &processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi; exit 3"}}, "(echo hi; exit 3\n)", false},
		{"cwd and envs", &processConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "pwd"}, Cwd: &cwd, Envs: map[string]string{"A": "it's"}},
			"(cd -- '/tmp/a b' && export A='it'\\''s' && pwd\n)", false},
		{"another argv is quoted", &processConfig{Cmd: "/usr/bin/env", Args: []string{"printf", "%s", "a b"}}, "('/usr/bin/env' 'printf' '%s' 'a b'\n)", false},
		{"no cmd", &processConfig{}, "", true},
		{"bad env name", &processConfig{Cmd: "sh", Args: []string{"-c", "x"}, Envs: map[string]string{"A;rm": "x"}}, "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := shellCommand(tt.p)
			if (err != nil) != tt.err {
				t.Fatalf("err %v, want error %v", err, tt.err)
			}
			if tt.err {
				if !errors.Is(err, state.ErrInvalid) {
					t.Errorf("err %v, want state.ErrInvalid", err)
				}
				return
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name, line string
		want       entryInfo
	}{
		{"file", "81a4|11|root|root|1700000000|/tmp/e2b/a.txt",
			entryInfo{Name: "a.txt", Type: fileTypeFile, Path: "/tmp/e2b/a.txt", Size: 11, Mode: 0o644, Permissions: "-rw-r--r--", Owner: "root", Group: "root", ModifiedTime: time.Unix(1700000000, 0).UTC()}},
		{"dir", "41ed|4096|user|users|1700000001|/home/user",
			entryInfo{Name: "user", Type: fileTypeDir, Path: "/home/user", Size: 4096, Mode: 0o755, Permissions: "drwxr-xr-x", Owner: "user", Group: "users", ModifiedTime: time.Unix(1700000001, 0).UTC()}},
		{"symlink, a name with the separator", "a1ff|7|root|root|0|/tmp/x|y",
			entryInfo{Name: "x|y", Type: fileTypeSymlink, Path: "/tmp/x|y", Size: 7, Mode: 0o777, Permissions: "Lrwxrwxrwx", Owner: "root", Group: "root", ModifiedTime: time.Unix(0, 0).UTC()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.line)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
	if _, err := parseStat("garbage"); err == nil {
		t.Error("garbage parsed")
	}
}

// TestWriteChunks: the pieces join to the content, and each stays under
// one command's budget however the bytes escape.
func TestWriteChunks(t *testing.T) {
	tests := []struct {
		name    string
		content []byte
		pieces  int
	}{
		{"small", []byte("hello"), 1},
		{"empty", nil, 1},
		{"5 MiB of text", bytes.Repeat([]byte("abcdefghij\n"), (5<<20)/11), 6},
		{"1 MiB of escapes", bytes.Repeat([]byte{0, '\'', 0xff, '\\'}, 1<<18), 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps := writeChunks(tt.content)
			if len(ps) != tt.pieces {
				t.Errorf("%d pieces, want %d", len(ps), tt.pieces)
			}
			if got := bytes.Join(ps, nil); !bytes.Equal(got, tt.content) {
				t.Errorf("pieces join to %d bytes, want the %d", len(got), len(tt.content))
			}
			for i, p := range ps {
				if len(p) > commandBudget {
					t.Errorf("piece %d: %d bytes over the budget", i, len(p))
				}
			}
		})
	}
}

// TestWireCodes: each error category answers the status and code the
// SDK maps to its error class.
func TestWireCodes(t *testing.T) {
	tests := []struct {
		name string
		err  error
		http int
		rpc  connect.Code
	}{
		{"unknown sandbox: NotFoundError", fmt.Errorf("x: %w", ErrUnknownSandbox), 404, connect.CodeNotFound},
		{"unknown file: FileNotFoundError", ErrUnknownFile, 404, connect.CodeNotFound},
		{"unknown env from the coordinator", fmt.Errorf("step: %w", state.ErrUnknownEnv), 404, connect.CodeNotFound},
		{"bad params: InvalidArgumentError", state.ErrInvalidParams, 400, connect.CodeInvalidArgument},
		{"exists: makeDir's false", ErrExists, 409, connect.CodeAlreadyExists},
		{"paused: TimeoutError", ErrPaused, 502, connect.CodeUnavailable},
		{"too many envs: RateLimitError", state.ErrTooManyEnvs, 429, connect.CodeResourceExhausted},
		{"shutting down", state.ErrShuttingDown, 503, connect.CodeUnavailable},
		{"not implemented", ErrNotImplemented, 501, connect.CodeUnimplemented},
		{"anything else", errors.New("boom"), 500, connect.CodeInternal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := httpStatus(tt.err); got != tt.http {
				t.Errorf("http %d, want %d", got, tt.http)
			}
			if got := connect.CodeOf(rpcError(tt.err)); got != tt.rpc {
				t.Errorf("rpc %v, want %v", got, tt.rpc)
			}
		})
	}
	if got := httpStatus(fmt.Errorf("%w", http.ErrBodyNotAllowed)); got != 500 {
		t.Errorf("unrelated error: %d", got)
	}
}

// TestMessagesJSON: the messages read and write the proto3 JSON the SDK
// (protobuf-es) writes and reads: lowerCamelCase, 64-bit integers as
// strings, bytes as base64, enums by name or number, a oneof's one field.
func TestMessagesJSON(t *testing.T) {
	var c jsonCodec
	var sig sendSignalRequest
	if err := c.Unmarshal([]byte(`{"process":{"pid":1001},"signal":"SIGNAL_SIGKILL"}`), &sig); err != nil {
		t.Fatal(err)
	}
	if sig.Process.Pid == nil || *sig.Process.Pid != 1001 || sig.Signal != sigKill {
		t.Errorf("decoded %+v", sig)
	}
	if err := c.Unmarshal([]byte(`{"process":{"pid":"7"},"signal":15}`), &sig); err != nil || *sig.Process.Pid != 7 || sig.Signal != sigTerm {
		t.Errorf("decoded %+v, %v", sig, err)
	}
	var lr listDirRequest
	if err := c.Unmarshal([]byte(`{"path":"/tmp","depth":2}`), &lr); err != nil || lr.Depth != 2 {
		t.Errorf("decoded %+v, %v", lr, err)
	}
	out, err := c.Marshal(&startResponse{Event: processEvent{Data: &dataEvent{Stdout: []byte("hi\n")}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), `{"event":{"data":{"stdout":"aGkK"}}}`; got != want {
		t.Errorf("data event %s, want %s", got, want)
	}
	out, _ = c.Marshal(&startResponse{Event: processEvent{End: &endEvent{ExitCode: 3, Exited: true, Status: "exit status 3"}}})
	if got, want := string(out), `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3"}}}`; got != want {
		t.Errorf("end event %s, want %s", got, want)
	}
	out, _ = c.Marshal(&entryResponse{Entry: entryInfo{Name: "a", Type: fileTypeFile, Size: 5 << 20, ModifiedTime: time.Unix(0, 0).UTC()}})
	var m map[string]map[string]any
	json.Unmarshal(out, &m)
	if m["entry"]["size"] != "5242880" || m["entry"]["type"] != "FILE_TYPE_FILE" || m["entry"]["modifiedTime"] != "1970-01-01T00:00:00Z" {
		t.Errorf("entry %s", out)
	}
	if err := c.Unmarshal([]byte(`{"signal":"SIGHUP"}`), &sig); err == nil || !strings.Contains(err.Error(), "signal") {
		t.Errorf("unknown signal: %v", err)
	}
}

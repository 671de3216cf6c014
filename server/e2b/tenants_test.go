package e2b_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// call sends one request with API key key (and the E2b-Sandbox-Id header
// when sandbox is set) and answers the status and body.
func call(t *testing.T, method, url, key, sandbox, contentType, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	if sandbox != "" {
		req.Header.Set("E2b-Sandbox-Id", sandbox)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// envelope is one Connect streaming message (flags 0) of JSON body.
func envelope(body string) string {
	var b bytes.Buffer
	b.WriteByte(0)
	binary.Write(&b, binary.BigEndian, uint32(len(body)))
	b.WriteString(body)
	return b.String()
}

// lastEnvelope is the JSON of the end-of-stream message of a Connect
// streaming answer (flags 2), the last envelope.
func lastEnvelope(t *testing.T, body string) string {
	t.Helper()
	ms := envelopes(t, body)
	if len(ms) == 0 {
		return ""
	}
	return ms[len(ms)-1]
}

// TestTenants: another tenant's API key reaches none of a sandbox's
// routes, REST or envd (commands, files, the file system service, fork
// of its states), and each refusal is the answer of a sandbox nobody
// made; the owner's sandbox goes on untouched. A request without a key
// is refused 401.
func TestTenants(t *testing.T) {
	url, _ := newServer(t)
	const alpha, beta, nobodys = "tok-alpha", "tok-beta", "0123456789ab"
	code, body := call(t, "POST", url+"/sandboxes", alpha, "", "application/json", `{"templateID":"e2b-task"}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ SandboxID string }
	json.Unmarshal([]byte(body), &sb)
	id := sb.SandboxID
	start := envelope(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo owned > /tmp/owner.txt"]}}`)
	if code, body := call(t, "POST", url+"/process.Process/Start", alpha, id, "application/connect+json", start); code != 200 || strings.Contains(lastEnvelope(t, body), "error") {
		t.Fatalf("alpha's command: %d %q", code, body)
	}
	code, body = call(t, "GET", url+"/sandboxes/"+id+"/states", alpha, "", "", "")
	var st struct{ Head string }
	if json.Unmarshal([]byte(body), &st); code != 200 || st.Head == "" {
		t.Fatalf("alpha's states: %d %s", code, body)
	}

	stat := `{"path":"/tmp/owner.txt"}`
	cases := []struct {
		name, method, path, sandbox, ctype, body string
	}{
		{"get info", "GET", "/sandboxes/ID", "", "", ""},
		{"kill", "DELETE", "/sandboxes/ID", "", "", ""},
		{"set timeout", "POST", "/sandboxes/ID/timeout", "", "application/json", `{"timeout":60}`},
		{"pause", "POST", "/sandboxes/ID/pause", "", "application/json", `{}`},
		{"connect", "POST", "/v2/sandboxes/ID/connect", "", "application/json", `{}`},
		{"fork", "POST", "/sandboxes/ID/fork", "", "application/json", `{"count":1}`},
		{"states", "GET", "/sandboxes/ID/states", "", "", ""},
		{"rollback", "POST", "/sandboxes/ID/rollback", "", "application/json", `{"stateID":"` + st.Head + `"}`},
		{"read file", "GET", "/files?path=/tmp/owner.txt", "ID", "", ""},
		{"write file", "POST", "/files?path=/tmp/owner.txt", "ID", "application/octet-stream", "stolen"},
		{"stat", "POST", "/filesystem.Filesystem/Stat", "ID", "application/json", stat},
		{"list processes", "POST", "/process.Process/List", "ID", "application/json", `{}`},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			req := func(sandbox string) (int, string) {
				p := strings.ReplaceAll(tt.path, "ID", sandbox)
				h := ""
				if tt.sandbox != "" {
					h = sandbox
				}
				return call(t, tt.method, url+p, beta, h, tt.ctype, tt.body)
			}
			code, body := req(id)
			ucode, ubody := req(nobodys)
			if code != ucode || code != http.StatusNotFound {
				t.Errorf("beta on alpha's sandbox: %d %s; on an unknown one: %d %s; want both 404", code, body, ucode, ubody)
			}
			if got, want := strings.ReplaceAll(body, id, "ID"), strings.ReplaceAll(ubody, nobodys, "ID"); got != want {
				t.Errorf("answer %q, an unknown sandbox's %q", got, want)
			}
		})
	}
	t.Run("command", func(t *testing.T) {
		code, body := call(t, "POST", url+"/process.Process/Start", beta, id, "application/connect+json",
			envelope(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo stolen > /tmp/owner.txt"]}}`))
		if end := lastEnvelope(t, body); code != 200 || !strings.Contains(end, `"not_found"`) {
			t.Errorf("beta's command in alpha's sandbox: %d %s, want a not_found end of stream", code, end)
		}
	})
	t.Run("fork a state", func(t *testing.T) {
		code, body := call(t, "POST", url+"/sandboxes/fork", beta, "", "application/json", `{"count":1,"stateID":"`+st.Head+`"}`)
		if code != http.StatusNotFound {
			t.Errorf("beta forks alpha's state: %d %s, want 404", code, body)
		}
	})
	// A template may name a snapshot (a state id): another tenant's is
	// answered as a name nothing has, and makes no sandbox.
	t.Run("create from a state", func(t *testing.T) {
		const unknown = "s0123456789ab"
		code, body := call(t, "POST", url+"/sandboxes", beta, "", "application/json", `{"templateID":"`+st.Head+`"}`)
		ucode, ubody := call(t, "POST", url+"/sandboxes", beta, "", "application/json", `{"templateID":"`+unknown+`"}`)
		if code == http.StatusCreated || code != ucode {
			t.Errorf("beta creates from alpha's state: %d %s; from an unknown one: %d %s; want the same refusal", code, body, ucode, ubody)
		}
		if got, want := strings.ReplaceAll(body, st.Head, "ID"), strings.ReplaceAll(ubody, unknown, "ID"); got != want {
			t.Errorf("answer %q, an unknown state's %q", got, want)
		}
	})
	t.Run("list", func(t *testing.T) {
		_, body := call(t, "GET", url+"/v2/sandboxes", beta, "", "", "")
		if strings.Contains(body, id) {
			t.Errorf("beta's list names alpha's sandbox: %s", body)
		}
		_, body = call(t, "GET", url+"/v2/sandboxes", alpha, "", "", "")
		if !strings.Contains(body, id) {
			t.Errorf("alpha's list lacks its sandbox: %s", body)
		}
	})
	t.Run("no key", func(t *testing.T) {
		if code, body := call(t, "GET", url+"/sandboxes/"+id, "", "", "", ""); code != http.StatusUnauthorized {
			t.Errorf("no key: %d %s, want 401", code, body)
		}
	})
	// Alpha's sandbox is as alpha left it.
	code, body = call(t, "GET", url+"/files?path=/tmp/owner.txt", alpha, id, "", "")
	if code != 200 || body != "owned\n" {
		t.Errorf("alpha's file: %d %q, want owned", code, body)
	}
	if code, body := call(t, "GET", url+"/sandboxes/"+id, alpha, "", "", ""); code != 200 || !strings.Contains(body, `"running"`) {
		t.Errorf("alpha's sandbox: %d %s", code, body)
	}
}

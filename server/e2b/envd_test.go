package e2b_test

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// envelopes splits a Connect streaming body into its messages' JSON.
func envelopes(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	b := []byte(body)
	for len(b) >= 5 {
		n := binary.BigEndian.Uint32(b[1:5])
		if int(n) > len(b)-5 {
			t.Fatalf("truncated envelope in %q", body)
		}
		out = append(out, string(b[5:5+n]))
		b = b[5+n:]
	}
	return out
}

// TestStartStream: a command's stream as the SDK reads it: the start
// event, keepalive events at the interval the client asks for while the
// turn runs, the output, the end event, and the turn's state id in the
// end of stream's trailers, the sandbox's head.
func TestStartStream(t *testing.T) {
	url, _ := newServer(t)
	code, body := call(t, "POST", url+"/sandboxes", "tok-alpha", "", "application/json", `{"templateID":"e2b-task"}`)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var sb struct{ SandboxID string }
	json.Unmarshal([]byte(body), &sb)
	req, _ := http.NewRequest("POST", url+"/process.Process/Start",
		strings.NewReader(envelope(`{"process":{"cmd":"/bin/bash","args":["-l","-c","sleep 2.5; echo done"]}}`)))
	req.Header.Set("X-Access-Token", "tok-alpha")
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Keepalive-Ping-Interval", "1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	msgs := envelopes(t, string(raw))
	if len(msgs) < 5 {
		t.Fatalf("%d messages, want start, 2 keepalives, data, end, end of stream: %q", len(msgs), msgs)
	}
	if !strings.HasPrefix(msgs[0], `{"event":{"start":{"pid":`) {
		t.Errorf("first message %s, want the start event", msgs[0])
	}
	keepalives := 0
	for _, m := range msgs[1 : len(msgs)-3] {
		if m == `{"event":{"keepalive":{}}}` {
			keepalives++
		}
	}
	if keepalives < 2 {
		t.Errorf("%d keepalives in a 2.5 s command at 1 s, want 2: %q", keepalives, msgs)
	}
	if got, want := msgs[len(msgs)-3], `{"event":{"data":{"stdout":"ZG9uZQo="}}}`; got != want {
		t.Errorf("data %s, want %s", got, want)
	}
	if got, want := msgs[len(msgs)-2], `{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}`; got != want {
		t.Errorf("end %s, want %s", got, want)
	}
	var eos struct{ Metadata map[string][]string }
	if err := json.Unmarshal([]byte(msgs[len(msgs)-1]), &eos); err != nil {
		t.Fatalf("end of stream %s: %v", msgs[len(msgs)-1], err)
	}
	var sid string
	for k, v := range eos.Metadata {
		if strings.EqualFold(k, "Arbor-State-Id") && len(v) == 1 {
			sid = v[0]
		}
	}
	_, body = call(t, "GET", url+"/sandboxes/"+sb.SandboxID+"/states", "tok-alpha", "", "", "")
	var st struct{ Head string }
	json.Unmarshal([]byte(body), &st)
	if sid == "" || sid != st.Head {
		t.Errorf("trailer state %q, the sandbox's head %q (end of stream %s)", sid, st.Head, msgs[len(msgs)-1])
	}
}

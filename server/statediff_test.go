package server_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/server"
)

// TestStateDiff: /ui/api/diff between two real states of a sandbox
// lists the files added, modified and deleted with their text diffs,
// reports a binary file as such, shows a symbolic link out of the
// sandbox as its target without following it (a host file's content
// never appears, also where a directory was replaced by such a link), and
// compares the shells' working directories; an unknown state is a 404,
// a missing one a 400, and the path is behind the view's token.
func TestStateDiff(t *testing.T) {
	_, addr := newServer(t, server.Options{Token: "sesame"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// What a host reader that followed the sandbox's links would read.
	const secret = "host-secret-4f1c9b"
	host := filepath.Join(t.TempDir(), "hostdir")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "f"), []byte(secret+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	c := dial(t, addr, &arbor.Options{Token: "sesame"})
	r, err := c.Reset(ctx, arbor.ResetParams{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.CloseEnv(context.Background(), r.EnvID) })
	step := func(cmd string) string {
		t.Helper()
		s, err := c.Step(ctx, r.EnvID, arbor.Bash(cmd, 30*time.Second))
		if err != nil || s.Obs.ExitCode != 0 {
			t.Fatalf("step %q: %v %+v", cmd, err, s)
		}
		return s.Info.StateID
	}
	a := step(`mkdir -p /work/d && cd /work && printf 'one\ntwo\nthree\n' > keep.txt && echo old > gone.txt && printf 'a\0b' > bin.dat && echo inside > d/f`)
	b := step(`cd /work && printf 'one\nTWO\nthree\n' > keep.txt && rm gone.txt && echo fresh > new.txt && printf 'a\0c' > bin.dat && ` +
		`ln -s ` + host + `/f evil && rm -r d && ln -s ` + host + ` d && mkdir sub && cd sub`)

	bearer := http.Header{"Authorization": {"Bearer sesame"}}
	base := "http://" + addr + "/ui/api/diff"
	resp := get(t, base+"?a="+a+"&b="+b, bearer)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("diff: %d %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), secret) {
		t.Fatalf("the diff shows the host file a sandbox link points at:\n%s", body)
	}
	var d server.StateDiff
	if err := json.Unmarshal(body, &d); err != nil {
		t.Fatal(err)
	}
	if d.A.State != a || d.B.State != b || d.A.Env != r.EnvID {
		t.Errorf("sides %+v %+v, want %s and %s of %s", d.A, d.B, a, b, r.EnvID)
	}
	files := map[string]server.FileDiff{}
	for _, f := range d.Files {
		files[f.Path] = f
	}
	for _, tt := range []struct {
		name, path, change string
		check              func(f server.FileDiff) bool
	}{
		{"modified text", "/work/keep.txt", "modified", func(f server.FileDiff) bool {
			return strings.Contains(f.Diff, "--- a/work/keep.txt\n+++ b/work/keep.txt\n") && strings.Contains(f.Diff, " one\n-two\n+TWO\n three\n")
		}},
		{"deleted", "/work/gone.txt", "deleted", func(f server.FileDiff) bool {
			return f.TypeA == "file" && f.TypeB == "" && strings.Contains(f.Diff, "+++ /dev/null\n@@ -1 +0,0 @@\n-old\n")
		}},
		{"added", "/work/new.txt", "added", func(f server.FileDiff) bool {
			return f.TypeB == "file" && strings.Contains(f.Diff, "--- /dev/null\n+++ b/work/new.txt\n@@ -0,0 +1 @@\n+fresh\n")
		}},
		{"binary", "/work/bin.dat", "modified", func(f server.FileDiff) bool { return f.Binary && f.Diff == "" && f.SizeB == 3 }},
		{"link out of the sandbox", "/work/evil", "added", func(f server.FileDiff) bool {
			return f.TypeB == "symlink" && f.LinkB == host+"/f" && f.Diff == ""
		}},
		{"dir replaced by a link out of the sandbox", "/work/d", "modified", func(f server.FileDiff) bool {
			return f.TypeA == "dir" && f.TypeB == "symlink" && f.LinkB == host && f.Diff == ""
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := files[tt.path]
			if !ok || f.Change != tt.change || !tt.check(f) {
				t.Errorf("%s: %+v (listed: %v), want %s", tt.path, f, ok, tt.change)
			}
		})
	}
	if d.Shell.CwdA != "/work" || d.Shell.CwdB != "/work/sub" {
		t.Errorf("shell %+v, want cwd /work then /work/sub", d.Shell)
	}
	if d.Changed != len(d.Files) || d.Truncated {
		t.Errorf("changed %d, files %d, truncated %v", d.Changed, len(d.Files), d.Truncated)
	}

	for _, tt := range []struct {
		name, query string
		h           http.Header
		code        int
		says        string
	}{
		{"unknown state", "?a=" + a + "&b=s-nosuchstate", bearer, http.StatusNotFound, "s-nosuchstate"},
		{"one state", "?a=" + a, bearer, http.StatusBadRequest, "two state ids"},
		{"no token", "?a=" + a + "&b=" + b, nil, http.StatusUnauthorized, "token"},
		{"wrong token", "?a=" + a + "&b=" + b, http.Header{"Authorization": {"Bearer wrong"}}, http.StatusUnauthorized, "token"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			resp := get(t, base+tt.query, tt.h)
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.code || !strings.Contains(string(b), tt.says) {
				t.Errorf("%s: %d %q, want %d saying %q", tt.query, resp.StatusCode, b, tt.code, tt.says)
			}
		})
	}
}

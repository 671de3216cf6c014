package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/arbor-env/arbor/cr/btrfs"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/image/registrytest"
)

// runCLI runs the CLI in this process with args and returns what it
// printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// TestImageCLI: arbor image pull, ls, rm and prune against a real
// registry (with credentials from --registry-auth), on a btrfs pool of
// the test's own.
func TestImageCLI(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (btrfs pool)")
	}
	reg := registrytest.Start(t, registrytest.Options{Auth: true})
	bb := registrytest.BusyboxLayer(t)
	d := reg.Push(t, "cli/env:1", registrytest.Image(t, v1.Config{Env: []string{"A=1"}}, bb,
		registrytest.Layer(t, registrytest.File{Name: "hello", Body: "hi"})))
	reg.Push(t, "cli/other:1", registrytest.Image(t, v1.Config{}, bb))
	dir := t.TempDir()
	t.Cleanup(func() {
		if s, err := btrfs.Open(context.Background(), btrfs.Options{StateDir: dir}); err == nil {
			s.Unmount(context.Background())
		}
	})
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	global := []string{"--state-dir", dir, "--pool-size", "2G", "--cache-dir", t.TempDir()}
	img := func(args ...string) (string, error) {
		return runCLI(t, append(append([]string{"image"}, args...), global...)...)
	}

	if out, err := img("pull", reg.Ref("cli/env:1")); err == nil || !strings.Contains(err.Error(), "refused the credentials") {
		t.Fatalf("pull without credentials: %v\n%s", err, out)
	}
	if _, err := img("pull", "--registry-auth", "no-colon", reg.Ref("cli/env:1")); err == nil || !strings.Contains(err.Error(), "HOST=USER:PASSWORD") {
		t.Errorf("a malformed --registry-auth: %v", err)
	}
	auth := reg.Host + "=" + reg.User + ":" + reg.Password
	out, err := img("pull", "--registry-auth", auth, reg.Ref("cli/env:1"))
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, out)
	}
	if !strings.Contains(out, "layers 2/2") || !strings.Contains(out, image.DigestName(d)) {
		t.Errorf("pull printed %q: want progress and the image", out)
	}
	t.Setenv("ARBOR_REGISTRY_AUTH", auth) // the env form, read by the flag's default
	if out, err := img("pull", reg.Ref("cli/other:1")); err != nil {
		t.Fatalf("pull with ARBOR_REGISTRY_AUTH: %v\n%s", err, out)
	}

	out, err = img("ls")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, reg.Ref("cli/env:1")) || !strings.Contains(out, d[:19]) {
		t.Errorf("ls:\n%s\nwant the ref and the digest", out)
	}
	out, err = img("ls", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var infos []image.Info
	if err := json.Unmarshal([]byte(out), &infos); err != nil || len(infos) != 2 {
		t.Fatalf("ls --json: %v %s", err, out)
	}
	for _, in := range infos {
		if in.Digest == d && (in.Config == nil || in.Config.Env[0] != "A=1" || len(in.Layers) != 2) {
			t.Errorf("ls --json: %+v", in)
		}
	}
	if out, err := img("rm", reg.Ref("cli/env:1")); err != nil || !strings.Contains(out, "removed "+image.DigestName(d)) {
		t.Fatalf("rm by ref: %v %s", err, out)
	}
	if _, err := img("rm", reg.Ref("cli/env:1")); err == nil {
		t.Error("rm of a ref that names nothing any more succeeded")
	}
	if out, err := img("prune"); err != nil || !strings.Contains(out, "removed 0 layers") {
		t.Errorf("prune after rm (which prunes): %v %s", err, out)
	}
}

func TestPullFromFlag(t *testing.T) {
	for _, tt := range []struct {
		in   []string
		none bool // nil: any registry
	}{{[]string{"*"}, false}, {[]string{"a:5000", "*"}, false}, {[]string{}, true}, {[]string{"a:5000"}, true}} {
		got := pullFromFlag(tt.in)
		if (got != nil) != tt.none || (got != nil && len(got) != len(tt.in)) {
			t.Errorf("pullFromFlag(%q) = %#v", tt.in, got)
		}
	}
	// --pull-from= (empty) reaches the store as "none", not "any".
	cmd := newServeCmd(&globalOptions{})
	if err := cmd.ParseFlags([]string{"--pull-from="}); err != nil {
		t.Fatal(err)
	}
	v, err := cmd.Flags().GetStringSlice("pull-from")
	if got := pullFromFlag(v); err != nil || got == nil || len(got) != 0 {
		t.Errorf("--pull-from= is %#v (%v), want none", got, err)
	}
}

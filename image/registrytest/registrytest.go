// Package registrytest runs a real OCI registry (the CNCF distribution
// registry of Debian's docker-registry package) on loopback for tests, and
// builds test images to push to it with go-containerregistry.
package registrytest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/crypto/bcrypt"

	"github.com/arbor-env/arbor/image"
)

// Binary is the registry Debian's docker-registry package installs.
const Binary = "/usr/bin/docker-registry"

// Registry is a running registry.
type Registry struct {
	// Host is its host:port on loopback.
	Host string
	// Dir is its storage root (blobs under docker/registry/v2/blobs).
	Dir string
	// User and Password are the credentials it asks for ("" when open).
	User, Password string
}

// Options shape a registry.
type Options struct {
	// Auth makes it ask for User/Password (htpasswd, basic auth).
	Auth bool
	// Addr is the loopback address to listen on (default 127.0.0.1).
	Addr string
}

// Start starts a registry for the test and stops it when the test ends.
// A missing docker-registry fails the test: make deps installs it.
func Start(t testing.TB, o Options) *Registry {
	t.Helper()
	if _, err := os.Stat(Binary); err != nil {
		t.Fatalf("%s missing: run make deps (package docker-registry)", Binary)
	}
	dir := t.TempDir()
	addr := o.Addr
	if addr == "" {
		addr = "127.0.0.1"
	}
	r := &Registry{Dir: filepath.Join(dir, "storage")}
	auth := ""
	if o.Auth {
		r.User, r.Password = "trainer", "s3cret-pass"
		h, err := bcrypt.GenerateFromPassword([]byte(r.Password), bcrypt.DefaultCost)
		if err != nil {
			t.Fatal(err)
		}
		pw := filepath.Join(dir, "htpasswd")
		if err := os.WriteFile(pw, []byte(r.User+":"+string(h)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: arbor-test\n    path: %s\n", pw)
	}
	var cmd *exec.Cmd
	var done chan error
	var logs SyncBuffer
	for try := 0; ; try++ {
		l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
		if err != nil {
			t.Fatal(err)
		}
		r.Host = l.Addr().String()
		l.Close()
		cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n%s",
			r.Dir, r.Host, auth)
		cf := filepath.Join(dir, "config.yml")
		if err := os.WriteFile(cf, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		logs.Reset()
		cmd = exec.Command(Binary, "serve", cf)
		cmd.Stdout, cmd.Stderr = &logs, &logs
		// A test binary killed (a timeout, an interrupted make test) must
		// not leave its registry running.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", Binary, err)
		}
		done = make(chan error, 1)
		go func(c *exec.Cmd, done chan<- error) { done <- c.Wait() }(cmd, done)
		if err := waitUp(r.Host, done); err == nil {
			break
		} else if try == 3 {
			t.Fatalf("registry did not come up on %s: %v\n%s", r.Host, err, logs.String())
		}
		cmd.Process.Kill()
		<-done
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	return r
}

// waitUp waits until the registry answers /v2/ (200, or 401 with auth),
// or its process (whose Wait result done carries) exits.
func waitUp(host string, done chan error) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + host + "/v2/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusUnauthorized {
				return nil
			}
		}
		select {
		case err := <-done:
			done <- err
			return fmt.Errorf("registry exited: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("timed out")
}

// Auth is the registry's credentials for a push.
func (r *Registry) Auth() authn.Authenticator {
	if r.User == "" {
		return authn.Anonymous
	}
	return &authn.Basic{Username: r.User, Password: r.Password}
}

// Ref is repo:tag on this registry.
func (r *Registry) Ref(repoTag string) string { return r.Host + "/" + repoTag }

// Push pushes img as repo:tag and returns its manifest digest.
func (r *Registry) Push(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Ref(repoTag))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img, remote.WithAuth(r.Auth()), remote.WithContext(context.Background())); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

// BlobPath is where the registry stores blob digest d.
func (r *Registry) BlobPath(d string) string {
	h := strings.TrimPrefix(d, "sha256:")
	return filepath.Join(r.Dir, "docker/registry/v2/blobs/sha256", h[:2], h, "data")
}

// File is one entry of a test layer.
type File struct {
	Name     string
	Body     string
	Mode     int64 // 0: 0644 files, 0755 dirs, 0777 symlinks
	Type     byte  // tar.TypeReg when 0
	Linkname string
	Uid, Gid int
}

// Layer makes a gzip layer of the given entries, in order.
func Layer(t testing.TB, files ...File) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.Name, Typeflag: f.Type, Mode: f.Mode, Linkname: f.Linkname, Uid: f.Uid, Gid: f.Gid,
			ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			switch h.Typeflag {
			case tar.TypeDir:
				h.Mode = 0o755
			case tar.TypeSymlink:
				h.Mode = 0o777
			default:
				h.Mode = 0o644
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(f.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, f.Body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytesLayer(t, buf.Bytes())
}

func bytesLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	// Compressed once, fast: the tests that push large layers run under
	// the race detector.
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithCompressedCaching, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TreeLayer makes a gzip layer of the directory tree at dir, with owners,
// modes and symlinks as they are.
func TreeLayer(t testing.TB, dir string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = rel
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return bytesLayer(t, buf.Bytes())
}

// BusyboxLayer is a layer of the busybox image's tree (the host's static
// busybox, its applets and /etc files): a base with a shell.
func BusyboxLayer(t testing.TB) v1.Layer {
	t.Helper()
	dir := t.TempDir()
	if err := image.WriteBusyboxTree(context.Background(), dir); err != nil {
		t.Fatalf("busybox tree: %v (make deps installs busybox-static)", err)
	}
	return TreeLayer(t, dir)
}

// Image stacks layers into an image for linux/amd64 with config c.
func Image(t testing.TB, c v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", c
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// SyncBuffer is a bytes.Buffer that several goroutines may write (a
// process's output copiers, a build's progress) while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) Reset() { s.mu.Lock(); s.b.Reset(); s.mu.Unlock() }

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

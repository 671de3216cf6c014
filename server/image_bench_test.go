package server_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/image"
	"github.com/arbor-env/arbor/image/registrytest"
	"github.com/arbor-env/arbor/server"
)

// BenchmarkPulledImage measures an OCI image of the built-in Debian
// image's size (its root file system, ~290 MB unpacked, as two layers:
// /usr and the rest) served by a real registry on loopback:
//
//   - pull: pull and unpack into the store, MB/s of unpacked tar and of
//     bytes on the wire;
//   - skopeo: `skopeo copy` of the same image to a directory in the same
//     run (download and digest checks only, no unpacking): the peer;
//   - first-reset: a reset of the image right after its pull;
//   - reset-pulled and reset-debian: reset p50 from the pulled image and
//     from the built-in debian image.
//
// docs/images.md gives the numbers of a run.
func BenchmarkPulledImage(b *testing.B) {
	if skipReason != "" {
		b.Skip(skipReason)
	}
	ctx := context.Background()
	cache, ok := (&image.Store{CacheDir: image.DefaultCacheDir}).DebianCache()
	if !ok {
		b.Fatal("no cached debian rootfs: run make test-images")
	}
	dir := b.TempDir()
	usr, rest := filepath.Join(dir, "usr.tar"), filepath.Join(dir, "rest.tar")
	if err := splitRootfs(cache, usr, rest); err != nil {
		b.Fatal(err)
	}
	var layers []v1.Layer
	var unpacked int64
	for _, p := range []string{rest, usr} {
		l, err := tarball.LayerFromFile(p, tarball.WithCompressedCaching)
		if err != nil {
			b.Fatal(err)
		}
		st, _ := os.Stat(p)
		unpacked += st.Size()
		layers = append(layers, l)
	}
	reg := registrytest.Start(b, registrytest.Options{})
	ref := reg.Ref("bench/debian:1")
	img := registrytest.Image(b, v1.Config{}, layers...)
	digest := reg.Push(b, "bench/debian:1", img)
	var wire int64
	for _, l := range layers {
		n, _ := l.Size()
		wire += n
	}
	_, addr := newServer(b, server.Options{})
	c := dial(b, addr, nil)
	drop := func() {
		if err := images.Remove(ctx, image.DigestName(digest)); err != nil && !errors.Is(err, image.ErrNotFound) {
			b.Fatal(err)
		}
	}

	b.Run("pull", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			drop()
			b.StartTimer()
			if _, err := images.Pull(ctx, ref, nil); err != nil {
				b.Fatal(err)
			}
		}
		secs := b.Elapsed().Seconds() / float64(b.N)
		b.ReportMetric(float64(unpacked)/1e6/secs, "MB/s")
		b.ReportMetric(float64(wire)/1e6/secs, "wire-MB/s")
	})
	b.Run("skopeo", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			out := filepath.Join(b.TempDir(), "img")
			b.StartTimer()
			cmd := exec.Command("skopeo", "copy", "--quiet", "--src-tls-verify=false", "docker://"+ref, "dir:"+out)
			if o, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("skopeo copy: %v: %s", err, o)
			}
		}
		secs := b.Elapsed().Seconds() / float64(b.N)
		b.ReportMetric(float64(unpacked)/1e6/secs, "MB/s")
		b.ReportMetric(float64(wire)/1e6/secs, "wire-MB/s")
	})
	b.Run("first-reset", func(b *testing.B) {
		timedResets(b, c, ref, func() {
			drop()
			if _, err := images.Pull(ctx, ref, nil); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("reset-pulled", func(b *testing.B) { timedResets(b, c, ref, nil) })
	b.Run("reset-debian", func(b *testing.B) {
		if _, err := images.Ensure(ctx, "debian", nil); err != nil {
			b.Fatal(err)
		}
		timedResets(b, c, "debian", nil)
	})
}

// timedResets resets image im b.N times (before each, outside the timer,
// calls before unless nil) and reports the p50.
func timedResets(b *testing.B, c *arbor.Client, im string, before func()) {
	ctx := context.Background()
	var resets []float64
	for b.Loop() {
		if before != nil {
			b.StopTimer()
			before()
			b.StartTimer()
		}
		start := time.Now()
		r, err := c.Reset(ctx, arbor.ResetParams{Image: im})
		if err != nil {
			b.Fatal(err)
		}
		resets = append(resets, time.Since(start).Seconds())
		b.StopTimer()
		c.CloseEnv(ctx, r.EnvID)
		b.StartTimer()
	}
	b.ReportMetric(p50(resets)*1e3, "p50-ms")
}

func p50(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// splitRootfs writes the rootfs tarball (zstd) as two uncompressed
// layer tars: the entries under usr/, and the rest.
func splitRootfs(src, usr, rest string) error {
	cmd := exec.Command("zstd", "-dc", src)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	fu, err := os.Create(usr)
	if err != nil {
		return err
	}
	defer fu.Close()
	fr, err := os.Create(rest)
	if err != nil {
		return err
	}
	defer fr.Close()
	tu, trest := tar.NewWriter(fu), tar.NewWriter(fr)
	tr := tar.NewReader(out)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		w := trest
		if n := strings.TrimPrefix(h.Name, "./"); n == "usr" || strings.HasPrefix(n, "usr/") {
			w = tu
		}
		if err := w.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(w, tr); err != nil {
			return err
		}
	}
	if err := errors.Join(tu.Close(), trest.Close()); err != nil {
		return err
	}
	return cmd.Wait()
}

package e2b_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/internal/npmtest"
)

// BenchmarkSDK measures create, a command round trip and fork(4) of a
// live sandbox through the E2B SDK (node, the pinned e2b package) and the
// same operations through Arbor's own protocol (the Go client over the
// websocket) on the same server in the same run: each one's median in
// ms, the SDK's overhead per call, and fork latency per child. b.N is the
// rounds of each side (a round: 1 create, 5 commands, 1 fork(4)).
func BenchmarkSDK(b *testing.B) {
	url, _ := newServer(b)
	dir := npmInstall(b)
	npmtest.Script(b, sdkDir, "bench.mjs", dir)
	b.ResetTimer()
	// The SDK's side.
	cmd := exec.Command("node", "bench.mjs", e2bTask.Name, strconv.Itoa(b.N))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY=tok-alpha")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		b.Fatalf("node bench.mjs: %v\n%s%s", err, out, stderr.Bytes())
	}
	sdk := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 {
			v, _ := strconv.ParseFloat(f[1], 64)
			sdk[strings.TrimSuffix(f[0], "_ms")] = v
		}
	}
	// The protocol's side.
	ctx := context.Background()
	c, err := arbor.Dial(ctx, strings.TrimPrefix(url, "http://"), &arbor.Options{Token: "tok-alpha"})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	took := map[string][]time.Duration{}
	timed := func(name string, fn func() error) {
		t := time.Now()
		if err := fn(); err != nil {
			b.Fatalf("%s: %v", name, err)
		}
		took[name] = append(took[name], time.Since(t))
	}
	for range b.N {
		var env string
		timed("create", func() error {
			r, err := c.Reset(ctx, arbor.ResetParams{Task: e2bTask.Name})
			if err == nil {
				env = r.EnvID
			}
			return err
		})
		if _, err := c.Step(ctx, env, arbor.Bash("true", 0)); err != nil {
			b.Fatal(err)
		}
		for range 5 {
			timed("command", func() error { _, err := c.Step(ctx, env, arbor.Bash("echo hi", 0)); return err })
		}
		var children []string
		timed("fork4", func() error {
			br, err := c.Branch(ctx, arbor.BranchParams{EnvID: env, N: 4})
			if err == nil {
				children = br.EnvIDs
			}
			return err
		})
		for _, ch := range children {
			c.CloseEnv(ctx, ch)
		}
		c.CloseEnv(ctx, env)
	}
	b.StopTimer()
	for _, name := range []string{"create", "command", "fork4"} {
		ds := took[name]
		slices.Sort(ds)
		proto := float64(ds[len(ds)/2].Microseconds()) / 1000
		b.ReportMetric(sdk[name], "sdk-"+name+"-ms")
		b.ReportMetric(proto, "proto-"+name+"-ms")
		b.ReportMetric(sdk[name]-proto, "overhead-"+name+"-ms")
	}
	b.ReportMetric(sdk["fork4"]/4, "sdk-fork-per-child-ms")
}

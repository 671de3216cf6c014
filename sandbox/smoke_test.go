package sandbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/arbor-env/arbor/sandbox"
	"github.com/arbor-env/arbor/sandbox/sandboxtest"
)

func TestSmoke(t *testing.T) {
	sandboxtest.RequireRoot(t)
	root := sandboxtest.BusyboxRoot(t, "")
	ctx := context.Background()
	sb, err := sandbox.Start(ctx, sandbox.Config{ID: "smoke", Root: root, InitBinary: sandboxtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(ctx)
	for _, c := range []string{"echo hi; echo err >&2", "cd /tmp; X=5", "echo $X; pwd", "false", "sleep 5"} {
		r, err := sb.Exec(ctx, c, sandbox.ExecOptions{Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("%q -> %+v out=%q err=%q\n", c, *r, r.Stdout, r.Stderr)
	}
}

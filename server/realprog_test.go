package server_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	arbor "github.com/arbor-env/arbor/clients/go"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/server"
)

// The real-programs suite (docs/inspector.md, "Real programs"): programs
// from Debian packages run inside a sandbox of image realprog
// (images/realprog.yaml) through the real server, with the Inspector as
// the coordinator's classifier and CRIU behind every checkpoint. Each
// program's state is changed over several turns; after every change the
// program's own client reads it in the live env; once the last turn has
// run, every state is branched twice and each child's client must read
// exactly what the live env read at that state (not what it read later),
// and one child must then go on as the live env did: the next turn and
// its read give what they gave live.

// realProg is one program of the suite.
type realProg struct {
	name string
	// image is the image it runs in: realprog when empty.
	image string
	// setup starts the program (a step each).
	setup []string
	// turns change the program's state, one step each.
	turns []string
	// probe is the program's own client reading its state; its stdout is
	// what a branch must give again.
	probe string
	// daemon: a long-lived process of the program runs in every turn, so
	// every turn must be checkpointed with the processes (proc or full).
	// Otherwise turns must be fs (they change files) and probes none.
	daemon bool
	// probeKinds, when set, are the kinds a probe may have instead (git
	// status refreshes the index: none or fs).
	probeKinds []string
}

// pyStep is a shell command that sends Python statements stmt to the
// interpreter reading /work/py.in and prints repr(expr) once it has run
// them (a nonce line marks the answer in /work/py.out). stmt and expr
// use no single quotes.
func pyStep(stmt, expr string) string {
	return fmt.Sprintf(`(n=$(date +%%s%%N); printf '%%s\nprint("@%%s", repr(%s))\n' '%s' "$n" > /work/py.in; `+
		`until grep -q "@$n " /work/py.out; do sleep 0.02; done; sed -n "s/.*@$n //p" /work/py.out)`, expr, stmt)
}

// tmuxStep types keys into session s's shell and waits for a line want
// on its pane.
func tmuxStep(keys, want string) string {
	return fmt.Sprintf("tmux send-keys -t s '%s' Enter && until tmux capture-pane -p -t s | grep -qx '%s'; do sleep 0.05; done", keys, want)
}

// sqlStep sends lines of commands to the SQLite writer and prints its
// acknowledgement.
func sqlStep(cmds ...string) string {
	return "printf '" + strings.Join(cmds, `\n`) + `\n' > /work/w.cmd && cat /work/w.ack`
}

// sqliteWriter is a Python process that keeps one connection to
// /work/app.db open and runs the commands it reads from the FIFO
// /work/w.cmd (begin, put K V, commit, rollback), answering on /work/w.ack:
// a transaction can stay open across turns, with the RESERVED lock and
// the rollback journal that go with it.
const sqliteWriter = `import sqlite3
db = sqlite3.connect("/work/app.db", isolation_level=None)
db.execute("create table if not exists t (k text primary key, v integer)")
while True:
    with open("/work/w.cmd") as f:
        lines = f.read().split("\n")
    out = []
    for line in lines:
        if not line:
            continue
        op, *args = line.split()
        if op == "begin":
            db.execute("begin immediate")
        elif op == "put":
            db.execute("insert or replace into t values (?, ?)", (args[0], int(args[1])))
        elif op == "commit":
            db.execute("commit")
        elif op == "rollback":
            db.execute("rollback")
        out.append("ok " + line + " in_tx=" + str(db.in_transaction))
    with open("/work/w.ack", "w") as f:
        f.write("\n".join(out) + "\n")
`

// nodeServer is an HTTP server keeping its state in memory: hits and a
// map set by /set?k=K&v=V; every answer is both, as JSON.
const nodeServer = `const http = require("http");
let hits = 0;
const store = {};
const srv = http.createServer((req, res) => {
  hits++;
  const u = new URL(req.url, "http://x");
  if (u.pathname === "/set") store[u.searchParams.get("k")] = u.searchParams.get("v");
  res.end(JSON.stringify({hits, store}) + "\n");
});
srv.keepAliveTimeout = 0; // idle connections stay open between turns
srv.listen(8080, "127.0.0.1", () => console.log("listening"));
`

// nodeClient is a long-lived client with one keep-alive connection to
// the server: it GETs each path it reads from the FIFO /work/n.cmd and
// answers on /work/n.ack with its connection's local port, whether the
// connection was reused, and the body.
const nodeClient = `const http = require("http"), fs = require("fs");
const agent = new http.Agent({keepAlive: true, maxSockets: 1});
function next() {
  const path = fs.readFileSync("/work/n.cmd", "utf8").trim();
  http.get({host: "127.0.0.1", port: 8080, path, agent}, res => {
    const port = res.socket.localPort, reused = res.req.reusedSocket;
    let body = "";
    res.on("data", d => body += d);
    res.on("end", () => {
      fs.writeFileSync("/work/n.ack", "port=" + port + " reused=" + reused + " " + body);
      setImmediate(next);
    });
  });
}
next();
`

// pgStep sends SQL to the psql client reading /work/pg/q.in, which holds
// one connection to the server open across turns, and prints what psql
// printed for it (a nonce \echo marks its end in /work/pg/q.out). sql
// uses no single quotes.
func pgStep(sql string) string {
	return fmt.Sprintf(`(l=$(wc -l < /work/pg/q.out); n=$(date +%%s%%N); printf '%%s\n\\echo @%%s\n' '%s' "$n" > /work/pg/q.in; `+
		`until grep -qx "@$n" /work/pg/q.out; do sleep 0.02; done; sed -n "$((l+1)),\$p" /work/pg/q.out | grep -vx "@$n")`, sql)
}

// pgRows is what a fresh connection reads: the committed rows of t.
const pgRows = `psql -h /work/pg -U postgres -XAtc "select coalesce(string_agg(k || '=' || v, ',' order by k), '-') from t"`

// pgHeld is what the held connection reads: its backend's pid (the
// same process in every child: a reconnect would get another, and psql
// would say it reset the connection), whether it is in a transaction
// that wrote, and the rows as it sees them (its own uncommitted changes
// too).
const pgHeld = "select pg_backend_pid(), pg_current_xact_id_if_assigned() is not null as in_tx, " +
	"coalesce(string_agg(k || $$=$$ || v, $$,$$ order by k), $$-$$) from t;"

// jupyterClient is a long-lived client of the kernel of
// /work/kernel.json (jupyter_client's BlockingKernelClient, its channels
// open across turns, as a notebook's are): it runs each cell it reads
// from the FIFO /work/j.cmd and answers on /work/j.ack with the execute
// reply's count and status, then the kernel's output.
const jupyterClient = `import jupyter_client
kc = jupyter_client.BlockingKernelClient(connection_file="/work/kernel.json")
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=20)
while True:
    with open("/work/j.cmd") as f:
        code = f.read()
    out = []
    def hook(msg):
        t, c = msg["msg_type"], msg["content"]
        if t == "stream":
            out.append(c["text"])
        elif t in ("execute_result", "display_data"):
            out.append(c["data"]["text/plain"] + "\n")
        elif t == "error":
            out.append(c["ename"] + ": " + c["evalue"] + "\n")
    r = kc.execute_interactive(code, output_hook=hook, timeout=20)
    with open("/work/j.ack", "w") as f:
        f.write("[%d] %s\n" % (r["content"]["execution_count"], r["content"]["status"]) + "".join(out))
`

// jupyterStep runs the cell code (no single quotes) in the kernel
// through the client and prints its answer.
func jupyterStep(code string) string {
	return "printf %s '" + code + "' > /work/j.cmd && cat /work/j.ack"
}

// realPrograms is the suite, in the order of issue 36's list that the
// image and time allow.
var realPrograms = []realProg{
	{
		name:   "redis",
		daemon: true,
		setup: []string{
			"redis-server --save '' --appendonly no --daemonize yes --bind 127.0.0.1 --port 6379 --logfile /work/redis.log" +
				" && until redis-cli ping 2>/dev/null | grep -q PONG; do sleep 0.05; done",
		},
		turns: []string{
			"redis-cli SET greeting hello && redis-cli INCR hits",
			"redis-cli SET greeting world && redis-cli INCRBY hits 10 && redis-cli RPUSH q a b c",
			"redis-cli DEL greeting && redis-cli INCR hits && redis-cli HSET h f1 v1 f2 v2 && redis-cli LPOP q",
			"redis-cli SET greeting again && redis-cli HDEL h f1 && redis-cli RPUSH q d",
		},
		probe: "redis-cli MGET greeting hits; redis-cli LRANGE q 0 -1; redis-cli HGETALL h; redis-cli DBSIZE",
	},
	{
		name:   "sqlite",
		daemon: true,
		setup: []string{
			"mkfifo /work/w.cmd /work/w.ack && cat > /work/writer.py <<'EOF'\n" + sqliteWriter + "EOF",
			"(python3 /work/writer.py > /work/writer.log 2>&1 &) && " + sqlStep("begin", "put a 1", "commit"),
		},
		turns: []string{
			sqlStep("begin", "put b 2", "put c 3", "commit"),
			// A transaction left open: the writer holds the RESERVED lock and
			// the journal exists; readers see the committed rows only.
			sqlStep("begin", "put a 10", "put d 4"),
			sqlStep("put e 5", "commit"),
			sqlStep("begin", "put b 20", "rollback", "begin", "put f 6", "commit"),
		},
		probe: "test -e /work/app.db-journal && echo journal; sqlite3 /work/app.db 'select k, v from t order by k'",
	},
	{
		name:   "python",
		daemon: true,
		setup: []string{
			"mkfifo /work/py.in && (python3 -i -u -q < /work/py.in > /work/py.out 2>&1 &) && (sleep infinity > /work/py.in &) && " +
				pyStep(`import sys, collections, random; sys.ps1 = sys.ps2 = ""`, "None"),
		},
		turns: []string{
			pyStep(`x = 41; c = collections.Counter("abc")`, "x"),
			pyStep(`x += 1; c.update("aab"); data = [i * i for i in range(5)]`, "x"),
			pyStep(`random.seed(7); del data; x *= 10`, "x"),
			pyStep(`data = {"k": random.random()}; c["z"] = 9`, "x"),
		},
		probe: pyStep("pass", `(x, sorted(c.items()), globals().get("data"), random.random())`),
	},
	{
		name: "make",
		setup: []string{
			"mkdir -p /work/proj && cd /work/proj && printf 'int twice(int);\\n' > util.h" +
				" && printf '#include <stdio.h>\\n#include \"util.h\"\\nint main(void){printf(\"%%d\\\\n\", twice(21));return 0;}\\n' > main.c" +
				" && printf '#include \"util.h\"\\nint twice(int x){return 2*x;}\\n' > util.c" +
				" && printf 'prog: main.o util.o\\n\\tgcc -o prog main.o util.o\\n%%.o: %%.c util.h\\n\\tgcc -c $<\\n' > Makefile" +
				// GNU make sets O_APPEND on its standard output and error,
				// open files it shares with the shell: a change of the shell's
				// descriptor table (proc) the first time make runs. Here, so
				// that the turns change files only.
				" && (make -q main.c || true)",
		},
		turns: []string{
			"make",
			"sed -i 's/2\\*x/3*x/' util.c && make",
			"sed -i 's/21/7/' main.c && make",
			"printf 'int twice(int);\\n#define BASE 5\\n' > util.h && sed -i 's/(7)/(BASE)/' main.c && make",
		},
		probe: "make -q && echo up-to-date; ./prog",
	},
	{
		name: "git",
		setup: []string{
			"git init -q /work/repo && cd /work/repo && git config user.email a@example.com && git config user.name a" +
				" && echo 1 > a && git add a && git commit -qm one",
		},
		turns: []string{
			"echo 2 > a && echo new > b && git add b",
			"git add a && echo 3 > a && git commit -qm two",
			// A lock left by a git that died: the next add must fail on it.
			"echo lock > .git/index.lock && echo 4 > c && ! git add c 2>/dev/null",
			"rm .git/index.lock && git add c && git rm -q --cached b",
		},
		probe:      "git status --porcelain --branch; git ls-files -s; git log --format=%s; test -e .git/index.lock && echo locked; true",
		probeKinds: []string{"none", "fs"},
	},
	{
		name:   "tmux",
		daemon: true,
		setup: []string{
			`tmux new -d -s s -x 80 -y 12 "env PS1='> ' bash --norc -i" && until tmux capture-pane -p -t s | grep -q '^>'; do sleep 0.05; done`,
		},
		turns: []string{
			tmuxStep("X=one; echo x=$X", "x=one"),
			tmuxStep("X=$X-two; echo x=$X", "x=one-two"),
			tmuxStep("cd /tmp && echo dir=$PWD x=$X", "dir=/tmp x=one-two"),
			tmuxStep("unset X; echo x=${X:-gone}", "x=gone"),
		},
		probe: "tmux capture-pane -p -t s | sed '/^$/d'; tmux display -p -t s '#{pane_current_path} #{session_windows}'",
	},
	{
		name:   "node",
		daemon: true,
		setup: []string{
			"mkfifo /work/n.cmd /work/n.ack && cat > /work/server.js <<'EOF'\n" + nodeServer + "EOF\n" +
				"cat > /work/client.js <<'EOF'\n" + nodeClient + "EOF",
			"(node /work/server.js > /work/server.log 2>&1 &) && until grep -q listening /work/server.log; do sleep 0.05; done" +
				" && (node /work/client.js > /work/client.log 2>&1 &) && echo /get > /work/n.cmd && cat /work/n.ack",
		},
		turns: []string{
			"echo '/set?k=a&v=1' > /work/n.cmd && cat /work/n.ack",
			"echo '/set?k=b&v=2' > /work/n.cmd && cat /work/n.ack",
			"echo '/set?k=a&v=3' > /work/n.cmd && cat /work/n.ack",
			"echo '/set?k=c&v=4' > /work/n.cmd && cat /work/n.ack",
		},
		// The client's own read: through its keep-alive connection (the
		// same local port, reused).
		probe: "echo /get > /work/n.cmd && cat /work/n.ack",
	},
	{
		name: "postgres",
		// The server runs as the postgres user: user namespace mode where
		// the server lacks CAP_SYS_RESOURCE (images/realprog-users.yaml).
		image:  "realprog-users",
		daemon: true,
		setup: []string{
			// Debian's server binaries, run as the postgres user (the server
			// refuses root), on a Unix socket only.
			"mkdir -p /work/pg && chown postgres:postgres /work/pg && mkfifo /work/pg/q.in && touch /work/pg/q.out" +
				" && runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D /work/pg/data -U postgres -A trust --no-locale -E UTF8 --no-sync > /work/pg/initdb.log" +
				` && runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D /work/pg/data -l /work/pg/server.log -w -s` +
				` -o "-k /work/pg -c listen_addresses= -c shared_buffers=16MB -c max_connections=20" start`,
			// The held connection: psql reading a FIFO held open by a sleep.
			"(PGAPPNAME=held stdbuf -oL psql -h /work/pg -U postgres -XqAt < /work/pg/q.in > /work/pg/q.out 2>&1 &) && (sleep infinity > /work/pg/q.in &) && " +
				pgStep("create table t (k text primary key, v int); insert into t values ($$a$$, 1); "+pgHeld),
		},
		turns: []string{
			pgStep("insert into t values ($$b$$, 2), ($$c$$, 3); " + pgHeld),
			// A transaction left open on the held connection: its rows are
			// its own until the next turn commits them.
			pgStep("begin; insert into t values ($$d$$, 4); update t set v = 10 where k = $$a$$; " + pgHeld),
			pgStep("delete from t where k = $$b$$; commit; " + pgHeld),
			// Another connection writes; the held one sees it.
			`psql -h /work/pg -U postgres -Xqc "insert into t values ('e', 5)" && ` + pgStep(pgHeld),
		},
		probe: pgRows + " && " + pgStep(pgHeld),
	},
	{
		name:   "jupyter",
		daemon: true,
		setup: []string{
			"mkfifo /work/j.cmd /work/j.ack && cat > /work/client.py <<'EOF'\n" + jupyterClient + "EOF\n" +
				"(python3 -m ipykernel_launcher -f /work/kernel.json > /work/kernel.log 2>&1 &) && until test -s /work/kernel.json; do sleep 0.05; done" +
				" && (python3 /work/client.py > /work/client.log 2>&1 &) && " + jupyterStep(`import random; random.seed(3); x = 41; x`),
		},
		turns: []string{
			jupyterStep(`x += 1; xs = [random.random() for _ in range(2)]; print(len(xs)); x`),
			jupyterStep(`d = {"x": x}; del xs; f = lambda n: n * x; f(2)`),
			jupyterStep(`x *= 10; d["y"] = f(3); random.random()`),
			jupyterStep(`del f; d.pop("x"); x - 1`),
		},
		probe: jupyterStep(`print(x, sorted(d.items()) if "d" in dir() else None, "xs" in dir(), "f" in dir(), random.random())`),
	},
}

var (
	realprogOnce sync.Once
	realprogErr  error
)

// realprogImage builds images realprog and realprog-users from their
// recipes, once per test binary (the recipe's .debs are cached on the host: docs/images.md).
func realprogImage(t testing.TB) {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	realprogOnce.Do(func() {
		p, err := filepath.Abs(filepath.Join("..", "images", "realprog.yaml"))
		if err != nil {
			realprogErr = err
			return
		}
		for _, name := range []string{"realprog", "realprog-users"} {
			start := time.Now()
			if _, realprogErr = images.BuildRecipe(context.Background(), name, filepath.Join(filepath.Dir(p), name+".yaml"), nil); realprogErr != nil {
				return
			}
			t.Logf("image %s built in %s", name, time.Since(start).Round(time.Millisecond))
		}
	})
	if realprogErr != nil {
		t.Fatalf("build the realprog images: %v", realprogErr)
	}
}

// realResult is what a run of one program gave.
type realResult struct {
	// kinds are the checkpoint kinds of the setup's steps, then of each
	// turn and its probe (the state's final kind, from states).
	kinds []string
	// queued are the kinds the steps queued (Info.Checkpoint).
	queued []string
	// failed are the checkpoint errors the steps reported (a step reports
	// its previous turn's).
	failed []string
	// live is the probe's output in the live env at each turn's state.
	live []string
	// misses: what a branch read differently from the live env.
	misses []string
	// branches are the times of the branch(2) calls.
	branches []time.Duration
}

// runRealProg runs p in a fresh env of image realprog: setup, then each
// turn followed by its probe; then branches every turn's state and
// compares, rounds times (the next turn in a child the first time only). It fails t only for errors of the harness (a step that does
// not exit 0); what differs is in the result.
func runRealProg(t testing.TB, c *arbor.Client, p realProg, rounds int) realResult {
	t.Helper()
	ctx := context.Background()
	img := p.image
	if img == "" {
		img = "realprog"
	}
	r, err := c.Reset(ctx, arbor.ResetParams{Image: img})
	if err != nil {
		t.Fatal(err)
	}
	env := r.EnvID
	defer c.CloseEnv(ctx, env)
	var res realResult
	var ids []string
	var all []*arbor.StepResult // every step of the live env
	for _, cmd := range p.setup {
		all = append(all, sh(t, c, env, cmd))
	}
	var outs []string // each turn's stdout
	for _, cmd := range p.turns {
		tr := sh(t, c, env, cmd)
		ids = append(ids, tr.Info.StateID)
		outs = append(outs, string(tr.Obs.Stdout))
		pr := sh(t, c, env, p.probe)
		res.live = append(res.live, string(pr.Obs.Stdout))
		all = append(all, tr, pr)
	}
	// A step's kind is the one queued with it, or, for a checkpoint, the
	// kind it settled as (it may grow while the tree is frozen).
	settled := map[string]string{}
	st, err := c.States(ctx, env)
	if err != nil {
		res.failed = append(res.failed, "states: "+err.Error())
	} else {
		for _, s := range st.States {
			settled[s.StateID] = s.Kind
		}
	}
	for _, r := range all {
		k := r.Info.Checkpoint
		if s, ok := settled[r.Info.StateID]; ok && k != "none" {
			k = s
		}
		res.kinds = append(res.kinds, k)
		res.queued = append(res.queued, r.Info.Checkpoint)
		if r.Info.CheckpointError != "" {
			res.failed = append(res.failed, r.Info.CheckpointError)
		}
	}
	for round := 0; round < rounds; round++ {
		for i, id := range ids {
			took, misses := branchAndRead(t, c, p, i, id, round == 0, outs, res.live)
			res.branches = append(res.branches, took)
			res.misses = append(res.misses, misses...)
		}
	}
	return res
}

// branchAndRead branches state i (id) of p twice and reads it in each
// child with the probe; with next, one child also runs the next turn and
// the probe after it. It returns how long the branch took and what
// differs from the live env (outs: each turn's stdout, live: each state's
// probe).
func branchAndRead(t testing.TB, c *arbor.Client, p realProg, i int, id string, next bool, outs, live []string) (time.Duration, []string) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	br, err := c.Branch(ctx, arbor.BranchParams{StateID: id, N: 2})
	took := time.Since(start)
	if err != nil || len(br.Errors) > 0 || len(br.EnvIDs) != 2 {
		return took, []string{fmt.Sprintf("state %d (%s): branch: %v %v", i+1, id, err, br)}
	}
	var misses []string
	for k, kid := range br.EnvIDs {
		if got := stepOut(t, c, kid, p.probe); got != live[i] {
			misses = append(misses, fmt.Sprintf("state %d child %d: %q, live read %q", i+1, k, got, live[i]))
		}
		if next && k == 0 && i+1 < len(p.turns) {
			// The child goes on as the live env did.
			if got := stepOut(t, c, kid, p.turns[i+1]); got != outs[i+1] {
				misses = append(misses, fmt.Sprintf("state %d child %d: turn %d printed %q, live %q", i+1, k, i+2, got, outs[i+1]))
			}
			if got := stepOut(t, c, kid, p.probe); got != live[i+1] {
				misses = append(misses, fmt.Sprintf("state %d child %d: after turn %d read %q, live %q", i+1, k, i+2, got, live[i+1]))
			}
		}
		c.CloseEnv(ctx, kid)
	}
	return took, misses
}

// stepOut runs cmd in env and returns its stdout, or its failure as text
// (a step that fails in a child is a difference, not a harness error).
func stepOut(t testing.TB, c *arbor.Client, env, cmd string) string {
	t.Helper()
	r, err := c.Step(context.Background(), env, arbor.Bash(cmd, 20*time.Second))
	if err != nil {
		return "error: " + err.Error()
	}
	if r.Obs.ExitCode != 0 {
		return fmt.Sprintf("exit %d: %s%s", r.Obs.ExitCode, r.Obs.Stdout, r.Obs.Stderr)
	}
	return string(r.Obs.Stdout)
}

// wantKinds checks the checkpoint kinds of a run of p, a step each: the
// setup changes files at least; with a daemon every turn and probe is at
// least proc (the daemon ran, or a lock was taken on a file it holds);
// without one a turn is fs (files only) and a probe none.
func wantKinds(p realProg, kinds []string) []string {
	ns := len(p.setup)
	if len(kinds) != ns+2*len(p.turns) {
		return []string{fmt.Sprintf("%d steps, want %d", len(kinds), ns+2*len(p.turns))}
	}
	var bad []string
	for i, k := range kinds {
		var want []string
		switch {
		case i < ns:
			want = []string{"fs", "proc", "full"}
		case p.daemon:
			want = []string{"proc", "full"}
		case (i-ns)%2 == 0:
			want = []string{"fs"}
		case p.probeKinds != nil:
			want = p.probeKinds
		default:
			want = []string{"none"}
		}
		if !slices.Contains(want, k) {
			bad = append(bad, fmt.Sprintf("step %d: %s, want %s", i+1, k, strings.Join(want, " or ")))
		}
	}
	return bad
}

// TestRealPrograms runs the suite (docs/inspector.md, "Real programs").
func TestRealPrograms(t *testing.T) {
	realprogImage(t)
	_, addr := newServerWith(t, server.Options{}, coordinator.Options{Classify: engine.Classify})
	c := dial(t, addr, nil)
	for _, p := range realPrograms {
		t.Run(p.name, func(t *testing.T) {
			if d, ok := t.Deadline(); ok && time.Until(d) < time.Minute {
				t.Fatalf("less than a minute left before the test binary's deadline: run with a longer -timeout")
			}
			res := runRealProg(t, c, p, 1)
			for i := 1; i < len(res.live); i++ {
				if res.live[i] == res.live[i-1] {
					t.Errorf("live reads of states %d and %d are the same (%q): the turns do not tell the states apart", i, i+1, res.live[i])
				}
			}
			for _, b := range wantKinds(p, res.kinds) {
				t.Errorf("checkpoint kinds %v: %s", res.kinds, b)
			}
			for _, f := range res.failed {
				t.Errorf("checkpoint failed: %s", f)
			}
			for _, m := range res.misses {
				t.Errorf("branch differs: %s", m)
			}
			t.Logf("kinds %v (queued %v); live reads %q", res.kinds, res.queued, res.live)
		})
	}
}

// BenchmarkRealPrograms prints a row per program: turns, checkpoint
// kinds, branch p50 and whether every branch was exact.
func BenchmarkRealPrograms(b *testing.B) {
	realprogImage(b)
	_, addr := newServerWith(b, server.Options{}, coordinator.Options{Classify: engine.Classify})
	c := dial(b, addr, nil)
	rows := map[string]string{} // the last run of each program's (b.Run runs it with b.N 1 first)
	for _, p := range realPrograms {
		b.Run(p.name, func(b *testing.B) {
			// One episode; b.N rounds of branches of its states.
			res := runRealProg(b, c, p, b.N)
			slices.Sort(res.branches)
			p50 := res.branches[len(res.branches)/2]
			b.ReportMetric(float64(p50.Microseconds())/1000, "branch-p50-ms")
			exact := "yes"
			if len(res.misses) > 0 || len(res.failed) > 0 || len(wantKinds(p, res.kinds)) > 0 {
				exact = "no"
			}
			rows[p.name] = fmt.Sprintf("| %s | %d | %s | %.0f ms | %s |", p.name, len(p.turns), kindCounts(res.kinds), float64(p50.Microseconds())/1000, exact)
		})
	}
	table := "| program | turns | checkpoint kinds (steps) | branch p50 | exact |\n|---|---|---|---|---|\n"
	for _, p := range realPrograms {
		if r, ok := rows[p.name]; ok {
			table += r + "\n"
		}
	}
	fmt.Fprint(os.Stdout, table)
	if path := os.Getenv("ARBOR_REALPROG_REPORT"); path != "" {
		// make bench-realprog's report (benchmarks/results/realprog.md).
		if err := os.WriteFile(path, []byte(realprogReport(table)), 0o644); err != nil {
			b.Error(err)
		}
	}
}

// realprogReport is the markdown report of a run of
// BenchmarkRealPrograms with table, its rows.
func realprogReport(table string) string {
	var uts unix.Utsname
	unix.Uname(&uts)
	bt := "1x"
	if f := flag.Lookup("test.benchtime"); f != nil {
		bt = f.Value.String()
	}
	// The load average says how shared the machine was (branch times
	// grow with it).
	load := "unknown"
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			load = strings.Join(f[:3], " ")
		}
	}
	return fmt.Sprintf(`# Real programs, branched exactly

Written by `+"`make bench-realprog`"+` (part of `+"`make bench`"+`): `+"`BenchmarkRealPrograms`"+`
(server/realprog_test.go) with `+"`-benchtime %s`"+`, %s UTC, Linux %s, %d CPUs,
load average at the end %s.
Each program of the real-programs suite (docs/inspector.md, "Real
programs") runs one episode in a sandbox of image realprog (postgres:
realprog-users, the same labelled as running other users): its setup, then
four turns each followed by its probe; then every turn's state is branched
(`+"`branch {state_id, n: 2}`"+`) once per round, and each child's probe must
print what the live env's printed at that state (the first round: one child
also runs the next turn and probe). Checkpoint kinds are those of the
episode's steps (setup, turns and probes); branch p50 is over the rounds'
branch calls; exact: every child read what the live env read, no
checkpoint failed and every kind was right.

%s`, bt, time.Now().UTC().Format("2006-01-02 15:04"), unix.ByteSliceToString(uts.Release[:]), runtime.NumCPU(),
		load, table)
}

// kindCounts summarises kinds as "proc 5, full 4".
func kindCounts(kinds []string) string {
	var parts []string
	for _, k := range []string{"none", "fs", "proc", "full"} {
		n := 0
		for _, got := range kinds {
			if got == k {
				n++
			}
		}
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	return strings.Join(parts, ", ")
}

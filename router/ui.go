package router

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/arbor-env/arbor/cluster"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/panics"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/server/ui"
	"github.com/arbor-env/arbor/state"
)

// UISource is the web view of the whole cluster (docs/ui.md): the nodes'
// own views (their /ui/api/ JSON, read over HTTP with the node token)
// merged. An env is asked of the node etcd places it on; the table, a
// task's tree and the health are every live node's, summed; the event
// stream is every node's streams in one.
func (r *Router) UISource() ui.Source { return &uiSource{r: r, hc: &http.Client{}} }

// uiTimeout bounds one read of a node's view (not its event stream).
const uiTimeout = 5 * time.Second

type uiSource struct {
	r  *Router
	hc *http.Client
}

// get reads path (with query) of node's view into v.
func (s *uiSource) get(ctx context.Context, n cluster.NodeInfo, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, uiTimeout)
	defer cancel()
	resp, err := s.do(ctx, n, path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v)
}

// do sends GET path to node n's view and checks the status: a 404 is
// state.ErrUnknownEnv, a 400 ErrInvalidParams (the node's message
// kept), anything else but 200 an error naming the node.
func (s *uiSource) do(ctx context.Context, n cluster.NodeInfo, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Addr+path, nil)
	if err != nil {
		return nil, err
	}
	if tok := s.r.o.NodeToken; s.r.o.ForwardTokens {
		req.Header.Set("Authorization", "Bearer "+tenant.Token(ctx)) // the client's view
	} else if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.ID, err)
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	text := strings.TrimSpace(string(msg))
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", state.ErrUnknownEnv, text)
	case http.StatusBadRequest:
		return nil, fmt.Errorf("%w: %s", state.ErrInvalidParams, text)
	}
	return nil, fmt.Errorf("node %s: %s %s: %s", n.ID, path, resp.Status, text)
}

// each calls f for every live node at once and returns the ids of those
// it failed for.
func (s *uiSource) each(ctx context.Context, f func(ctx context.Context, n cluster.NodeInfo) error) (failed []string) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range s.r.view.Nodes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := panics.Call(s.r.log, func() error { return f(ctx, n) }, slog.String("node", n.ID)); err != nil {
				s.r.log.Debug("web view: node did not answer", "node", n.ID, "err", err)
				mu.Lock()
				failed = append(failed, n.ID)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(failed)
	return failed
}

func (s *uiSource) Envs(ctx context.Context) (ui.EnvsAnswer, error) {
	out := ui.EnvsAnswer{Envs: []ui.EnvRow{}, Tasks: []string{}}
	var mu sync.Mutex
	out.Unavailable = s.each(ctx, func(ctx context.Context, n cluster.NodeInfo) error {
		var a ui.EnvsAnswer
		if err := s.get(ctx, n, "/ui/api/envs", &a); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range a.Envs {
			e.Node = n.ID
			out.Envs = append(out.Envs, e)
		}
		for _, t := range a.Tasks {
			if !slices.Contains(out.Tasks, t) {
				out.Tasks = append(out.Tasks, t)
			}
		}
		return nil
	})
	sort.Slice(out.Envs, func(i, j int) bool { return out.Envs[i].ID < out.Envs[j].ID })
	sort.Strings(out.Tasks)
	return out, nil
}

// Tree asks an env's tree of the node holding the env, and a task's of
// every node, merged: an env or state a node lists is listed once.
func (s *uiSource) Tree(ctx context.Context, scope ui.TreeScope) (*ui.Tree, error) {
	if (scope.Env == "") == (scope.Task == "") {
		return nil, fmt.Errorf("%w: a tree needs exactly one of env and task", state.ErrInvalidParams)
	}
	q := url.Values{}
	if scope.Env != "" {
		q.Set("env", scope.Env)
		node, err := s.r.envNode(ctx, scope.Env)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", state.ErrUnknownEnv, err)
		}
		n, ok := s.r.view.Node(node)
		if !ok {
			return nil, fmt.Errorf("env %s: its node %s is gone", scope.Env, node)
		}
		var t ui.Tree
		if err := s.get(ctx, n, "/ui/api/tree?"+q.Encode(), &t); err != nil {
			return nil, err
		}
		return &t, nil
	}
	q.Set("task", scope.Task)
	out := &ui.Tree{Scope: scope, Envs: []ui.TreeEnv{}, Nodes: []ui.TreeNode{}}
	envs, nodes := map[string]bool{}, map[string]bool{}
	var mu sync.Mutex
	failed := s.each(ctx, func(ctx context.Context, n cluster.NodeInfo) error {
		var t ui.Tree
		if err := s.get(ctx, n, "/ui/api/tree?"+q.Encode(), &t); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		for _, e := range t.Envs {
			if !envs[e.ID] {
				envs[e.ID] = true
				out.Envs = append(out.Envs, e)
			}
		}
		for _, tn := range t.Nodes {
			if key := tn.Env + "/" + tn.ID; !nodes[key] {
				nodes[key] = true
				out.Nodes = append(out.Nodes, tn)
			}
		}
		out.Truncated = out.Truncated || t.Truncated
		return nil
	})
	if len(failed) > 0 && len(failed) == len(s.r.view.Nodes()) {
		return nil, fmt.Errorf("no node answered for task %s's tree (%s)", scope.Task, strings.Join(failed, ", "))
	}
	out.Truncated = out.Truncated || len(failed) > 0
	sort.SliceStable(out.Nodes, func(i, j int) bool { return out.Nodes[i].Created.Before(out.Nodes[j].Created) })
	return out, nil
}

// Health sums the live nodes' health; a node that does not answer is
// left out of the sum.
func (s *uiSource) Health(ctx context.Context) (coordinator.Health, error) {
	out := coordinator.Health{Checkpoints: map[string]float64{}, Verified: map[string]float64{}}
	var mu sync.Mutex
	failed := s.each(ctx, func(ctx context.Context, n cluster.NodeInfo) error {
		var h coordinator.Health
		if err := s.get(ctx, n, "/ui/api/health", &h); err != nil {
			return err
		}
		mu.Lock()
		out.Add(n.ID, h)
		mu.Unlock()
		return nil
	})
	if nodes := s.r.view.Nodes(); len(nodes) > 0 && len(failed) == len(nodes) {
		return out, fmt.Errorf("no node answered for health (%s)", strings.Join(failed, ", "))
	}
	return out, nil
}

// Subscribe follows the event stream of every node live now. When one of
// them ends (the node is gone, or it dropped us for falling behind), the
// merged feed ends as dropped: the page reconnects and reloads, and then
// follows the nodes live at that time. Health events are not relayed: the
// view pushes the cluster's own sum.
func (s *uiSource) Subscribe(ctx context.Context, buf int) ui.Feed {
	ctx, cancel := context.WithCancel(ctx)
	f := &clusterFeed{c: make(chan ui.Event, buf), cancel: cancel}
	nodes := s.r.view.Nodes()
	var wg sync.WaitGroup
	for _, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := panics.Call(s.r.log, func() error { return s.follow(ctx, n, f) }, slog.String("node", n.ID))
			if ctx.Err() == nil {
				s.r.log.Debug("web view: node's event stream ended", "node", n.ID, "err", err)
				f.dropped.Store(true)
				cancel()
			}
		}()
	}
	go func() {
		if len(nodes) == 0 {
			<-ctx.Done()
		}
		wg.Wait()
		close(f.c)
	}()
	return f
}

// follow relays node n's server-sent events into f until the stream or
// ctx ends.
func (s *uiSource) follow(ctx context.Context, n cluster.NodeInfo, f *clusterFeed) error {
	resp, err := s.do(ctx, n, "/ui/api/events")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var event, data string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = strings.TrimPrefix(line, "data: ")
		case line == "":
			ev, name := ui.Event{}, event
			event = ""
			if name == "" || name == "hello" || name == "health" {
				continue
			}
			if name == "resync" {
				return errors.New("the node dropped the stream (fell behind)")
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return fmt.Errorf("event %s: %w", name, err)
			}
			select {
			case f.c <- ev:
			case <-ctx.Done():
				return ctx.Err()
			default:
				return errors.New("the browser fell behind the cluster's feed")
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return io.EOF
}

type clusterFeed struct {
	c       chan ui.Event
	cancel  context.CancelFunc
	dropped atomic.Bool
}

func (f *clusterFeed) C() <-chan ui.Event { return f.c }
func (f *clusterFeed) Dropped() bool      { return f.dropped.Load() }
func (f *clusterFeed) Close()             { f.cancel() }

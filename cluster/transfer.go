package cluster

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/arbor-env/arbor/branch"
	"github.com/arbor-env/arbor/coordinator"
	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/state"
)

// TransferPrefix is where a node serves state transfers, on its
// protocol listener (docs/cluster.md, "State transfer"):
//
//	POST /cluster/v1/holds   branch.Offer -> branch.Holding
//	POST /cluster/v1/import  a transfer stream -> branch.TransferStats
//	POST /cluster/v1/ship    ShipRequest -> branch.TransferStats
//	POST /cluster/v1/precopy MigrateRequest -> MigrateStats
//	POST /cluster/v1/migrate MigrateRequest -> MigrateStats
//	POST /cluster/v1/adopt   AdoptRequest -> {}
//	POST /cluster/v1/drain   -> DrainStats
//
// Every request must carry the node's token ("Authorization: Bearer").
const TransferPrefix = "/cluster/v1/"

// ShipRequest asks a node to ship one of its states to another node.
type ShipRequest struct {
	State string `json:"state"`
	// To is host:port of the receiving node's transfer endpoint
	// (NodeInfo.Transfer).
	To string `json:"to"`
}

// MigrateRequest asks a node to move one of its envs to another node:
// precopy ships the env's lineage while it runs, migrate stops it and
// moves it.
type MigrateRequest struct {
	Env string `json:"env"`
	// To is host:port of the target node's transfer endpoint.
	To string `json:"to"`
}

// MigrateStats describe a migration's part on the source node.
type MigrateStats struct {
	Env string `json:"env"`
	// State is the env's head: the state the target restored (migrate),
	// or the newest one shipped ahead (precopy).
	State string `json:"state"`
	// States and Bytes count the states shipped and their streams.
	States int   `json:"states"`
	Bytes  int64 `json:"bytes"`
	// Pause is how long the env served nothing (migrate: from the
	// source's hold of it to the target's restore), Took the whole call.
	Pause time.Duration `json:"pause"`
	Took  time.Duration `json:"took"`
}

// AdoptRequest asks the target of a migration to open the env at state,
// with its image and the labels its owner keeps on it.
type AdoptRequest struct {
	Env    string            `json:"env"`
	State  string            `json:"state"`
	Image  string            `json:"image"`
	Labels map[string]string `json:"labels,omitempty"`
	// Recovered: the env's node died and this is its replica's restore
	// (a router's failover), not a migration: the env's first operation
	// on the target reports the state it went back to.
	Recovered bool `json:"recovered,omitempty"`
	// StepKeys are the env's step keys on the source (StepKeys' encoding),
	// so that a retry of a keyed step answers there what it answered here.
	StepKeys []byte `json:"step_keys,omitempty"`
}

// StepKeys carry the step keys of an env (the server's record of keyed
// steps, docs/protocol.md "Idempotent steps") across its migration; the
// node's server.Server is one.
type StepKeys interface {
	ExportStepKeys(env string) ([]byte, error)
	ImportStepKeys(env string, keys []byte) error
}

// adoptBodyBytes bounds an adopt request: its step keys' results are at
// most server.MigratedKeyBytes.
const adoptBodyBytes = 16 << 20

// TransferOptions configure a Transfer.
type TransferOptions struct {
	// Coordinator is the node's: migrations take its envs' tickets,
	// close them and adopt them (nil: no migrations, Engine alone).
	Coordinator *coordinator.Coordinator
	// Engine is the node's engine (default: the Coordinator's).
	Engine *branch.Engine
	// Node records the states this node imports (nil: none recorded).
	Node *Node
	// Token is the node's token: every request must present it, and it
	// is presented to the nodes this one ships to (a cluster's nodes
	// share one token). "" accepts any request (loopback only).
	Token string
	// Timeout bounds one shipment, on both sides (default 10 min).
	Timeout time.Duration
	// StepKeys is the node's server, whose step keys migrations carry
	// (nil: they are not carried; UseStepKeys sets it once the server
	// is made).
	StepKeys StepKeys
	// DialTimeout bounds the connection to a receiver (default 5 s).
	DialTimeout time.Duration
	Logger      *slog.Logger
}

// Transfer ships states between nodes: it serves the receiving side of a
// transfer and sends states of its engine to other nodes.
type Transfer struct {
	o   TransferOptions
	cli *http.Client
	log *slog.Logger
	// imported and held count the streams this node took: states
	// committed, and states it held already.
	imported, held atomic.Int64
}

// Imported counts the states this node imported, and the streams it
// read of states it held already.
func (t *Transfer) Imported() (imported, held int64) { return t.imported.Load(), t.held.Load() }

// UseStepKeys makes migrations carry the step keys of k (the node's
// server, made after its Transfer); call it before the node serves.
func (t *Transfer) UseStepKeys(k StepKeys) { t.o.StepKeys = k }

// NewTransfer makes a node's Transfer.
func NewTransfer(o TransferOptions) *Transfer {
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Engine == nil && o.Coordinator != nil {
		o.Engine = o.Coordinator.Engine()
	}
	tr := &http.Transport{DialContext: (&net.Dialer{Timeout: o.DialTimeout}).DialContext, MaxIdleConnsPerHost: 4,
		IdleConnTimeout: time.Minute}
	return &Transfer{o: o, cli: &http.Client{Transport: tr}, log: o.Logger}
}

// Handler serves TransferPrefix.
func (t *Transfer) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+TransferPrefix+"holds", t.serveHolds)
	mux.HandleFunc("POST "+TransferPrefix+"import", t.serveImport)
	mux.HandleFunc("POST "+TransferPrefix+"ship", t.serveShip)
	mux.HandleFunc("POST "+TransferPrefix+"precopy", t.serveMigrate(t.Precopy))
	mux.HandleFunc("POST "+TransferPrefix+"migrate", t.serveMigrate(t.Migrate))
	mux.HandleFunc("POST "+TransferPrefix+"adopt", t.serveAdopt)
	mux.HandleFunc("POST "+TransferPrefix+"drain", t.serveDrain)
	mux.HandleFunc("POST "+TransferPrefix+"keep", t.serveKeep)
	return t.auth(mux)
}

func (t *Transfer) auth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if t.o.Token != "" && subtle.ConstantTimeCompare([]byte(tok), []byte(t.o.Token)) != 1 {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// transferError is the body of a refused transfer request.
type transferError struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func errCode(err error) int {
	switch {
	case errors.Is(err, state.ErrUnknownEnv), errors.Is(err, state.ErrUnknownEnv):
		return http.StatusNotFound
	case errors.Is(err, state.ErrInvalid), errors.Is(err, state.ErrInvalid):
		return http.StatusConflict
	case errors.Is(err, state.ErrTooManyEnvs):
		return http.StatusServiceUnavailable
	case errors.Is(err, state.ErrUnknownState):
		return http.StatusNotFound
	case errors.Is(err, branch.ErrUnsupported):
		return http.StatusNotImplemented
	case errors.Is(err, branch.ErrTransfer):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func (t *Transfer) serveHolds(w http.ResponseWriter, r *http.Request) {
	var o branch.Offer
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&o); err != nil || o.State == "" {
		writeJSON(w, http.StatusBadRequest, transferError{fmt.Sprintf("bad offer: %v", err)})
		return
	}
	writeJSON(w, http.StatusOK, t.o.Engine.Holds(o))
}

func (t *Transfer) serveImport(w http.ResponseWriter, r *http.Request) {
	// The stream may take long, but not for ever: a sender that stalls
	// is cut off.
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(t.o.Timeout))
	ctx, cancel := context.WithTimeout(r.Context(), t.o.Timeout)
	defer cancel()
	stats, err := t.o.Engine.Import(ctx, r.Body)
	if err != nil {
		t.log.Warn("import refused", slog.String("state", stats.State), slog.Any("err", err))
		writeJSON(w, errCode(err), transferError{err.Error()})
		return
	}
	if stats.Held {
		t.held.Add(1)
	} else {
		t.imported.Add(1)
	}
	if t.o.Node != nil {
		if st, err := t.o.Engine.State(stats.State); err == nil {
			t.o.Node.StateMade(st.Env, st.ID)
		}
	}
	writeJSON(w, http.StatusOK, stats)
}

func (t *Transfer) serveShip(w http.ResponseWriter, r *http.Request) {
	var req ShipRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.State == "" || req.To == "" {
		writeJSON(w, http.StatusBadRequest, transferError{fmt.Sprintf("bad ship request (want state and to): %v", err)})
		return
	}
	stats, err := t.Ship(r.Context(), req.State, req.To)
	if err != nil {
		writeJSON(w, errCode(err), transferError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, stats)
}

// Ship sends state sid of this node's engine to the node whose transfer
// endpoint is at addr (host:port), unless it holds it already: the
// receiver says which artifacts it holds, the stream leaves those out
// and sends the file snapshot against the nearest ancestor's it holds.
// When an incremental stream is refused it is sent once more whole.
func (t *Transfer) Ship(ctx context.Context, sid, addr string) (branch.TransferStats, error) {
	ctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	offer, err := t.o.Engine.Offer(sid)
	if err != nil {
		return branch.TransferStats{}, err
	}
	var have branch.Holding
	if err := t.post(ctx, addr, "holds", "application/json", jsonBody(offer), &have); err != nil {
		return branch.TransferStats{}, fmt.Errorf("ship %s to %s: %w", sid, addr, err)
	}
	if have.State {
		return branch.TransferStats{State: sid, Held: true}, nil
	}
	stats, err := t.send(ctx, sid, addr, have.Artifacts)
	if err != nil && len(have.Artifacts) > 0 && ctx.Err() == nil {
		// An incremental stream the receiver could not apply (its copy
		// of the base came another way): once more, whole.
		t.log.Warn("incremental transfer refused; sending it whole", slog.String("state", sid), slog.String("to", addr), slog.Any("err", err))
		stats, err = t.send(ctx, sid, addr, nil)
	}
	return stats, err
}

// send streams the export of sid to addr's import.
func (t *Transfer) send(ctx context.Context, sid, addr string, have []string) (branch.TransferStats, error) {
	pr, pw := io.Pipe()
	type result struct {
		stats branch.TransferStats
		err   error
	}
	done := make(chan result, 1)
	go func() {
		st, err := t.o.Engine.Export(ctx, sid, have, pw)
		pw.CloseWithError(err)
		done <- result{st, err}
	}()
	var in branch.TransferStats
	err := t.post(ctx, addr, "import", "application/octet-stream", pr, &in)
	pr.CloseWithError(errors.New("receiver answered"))
	out := <-done
	if out.err != nil && err == nil {
		err = out.err
	}
	if err != nil {
		return out.stats, fmt.Errorf("ship %s to %s: %w", sid, addr, err)
	}
	out.stats.Took = max(out.stats.Took, in.Took)
	return out.stats, nil
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

// post sends body to another node's route and decodes its answer into
// out; a refusal is an error with the receiver's message.
func (t *Transfer) post(ctx context.Context, addr, route, ctype string, body io.Reader, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+TransferPrefix+route, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", ctype)
	if t.o.Token != "" {
		req.Header.Set("Authorization", "Bearer "+t.o.Token)
	}
	resp, err := t.cli.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		var te transferError
		if json.Unmarshal(b, &te) != nil || te.Error == "" {
			te.Error = strings.TrimSpace(string(b))
		}
		err := fmt.Errorf("%s answered %s: %s", addr, resp.Status, te.Error)
		if resp.StatusCode == http.StatusBadRequest {
			err = fmt.Errorf("%w: %w", branch.ErrTransfer, err)
		}
		return err
	}
	return json.Unmarshal(b, out)
}

// ShipClient asks nodes to ship states to each other (the router).
type ShipClient struct {
	Token   string
	Timeout time.Duration
	cli     *http.Client
}

// NewShipClient makes a client presenting token to the nodes; timeout
// bounds one shipment (default 10 min), dial a connection (5 s).
func NewShipClient(token string, timeout time.Duration) *ShipClient {
	if timeout <= 0 {
		timeout = 10 * time.Minute
	}
	tr := &http.Transport{DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext, MaxIdleConnsPerHost: 4, IdleConnTimeout: time.Minute}
	return &ShipClient{Token: token, Timeout: timeout, cli: &http.Client{Transport: tr}}
}

// Ship asks the node whose transfer endpoint is at from to ship state
// sid to the one at to.
func (c *ShipClient) Ship(ctx context.Context, from, to, sid string) (branch.TransferStats, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	t := &Transfer{o: TransferOptions{Token: c.Token}, cli: c.cli}
	var stats branch.TransferStats
	if err := t.post(ctx, from, "ship", "application/json", jsonBody(ShipRequest{State: sid, To: to}), &stats); err != nil {
		return stats, fmt.Errorf("ship %s from %s to %s: %w", sid, from, to, err)
	}
	return stats, nil
}

func (t *Transfer) serveMigrate(f func(context.Context, string, string) (MigrateStats, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req MigrateRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil || req.Env == "" || req.To == "" {
			writeJSON(w, http.StatusBadRequest, transferError{fmt.Sprintf("bad migrate request (want env and to): %v", err)})
			return
		}
		if t.o.Coordinator == nil {
			writeJSON(w, http.StatusNotImplemented, transferError{"this node does not migrate envs"})
			return
		}
		stats, err := f(r.Context(), req.Env, req.To)
		if err != nil {
			t.log.Warn("migration failed", slog.String("env", req.Env), slog.String("to", req.To), slog.Any("err", err))
			writeJSON(w, errCode(err), transferError{err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, stats)
	}
}

func (t *Transfer) serveAdopt(w http.ResponseWriter, r *http.Request) {
	var req AdoptRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, adoptBodyBytes)).Decode(&req); err != nil || req.Env == "" || req.State == "" {
		writeJSON(w, http.StatusBadRequest, transferError{fmt.Sprintf("bad adopt request (want env and state): %v", err)})
		return
	}
	if t.o.Coordinator == nil {
		writeJSON(w, http.StatusNotImplemented, transferError{"this node does not adopt envs"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), t.o.Timeout)
	defer cancel()
	// The keys first: the env's first request here may be a retry.
	keys := t.o.StepKeys
	if len(req.StepKeys) == 0 {
		keys = nil // nothing to carry, nothing to take back
	}
	if keys != nil {
		if err := keys.ImportStepKeys(req.Env, req.StepKeys); err != nil {
			writeJSON(w, http.StatusBadRequest, transferError{err.Error()})
			return
		}
	}
	adopt := t.o.Coordinator.Adopt
	if req.Recovered {
		adopt = t.o.Coordinator.AdoptRecovered
	}
	if err := adopt(ctx, req.Env, req.State, req.Image, req.Labels); err != nil {
		if keys != nil {
			keys.ImportStepKeys(req.Env, nil)
		}
		writeJSON(w, errCode(err), transferError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

// shipLineage ships state sid and its ancestors to addr, oldest first, so
// that each file snapshot goes as the difference from its parent's;
// states the receiver holds cost a question each.
func (t *Transfer) shipLineage(ctx context.Context, sid, addr string, into *MigrateStats) error {
	line, err := t.o.Engine.Lineage(sid)
	if err != nil {
		return err
	}
	for _, st := range line {
		s, err := t.Ship(ctx, st.ID, addr)
		if err != nil {
			return err
		}
		if !s.Held {
			into.States++
			into.Bytes += s.Bytes
		}
	}
	into.State = sid
	return nil
}

// Precopy ships env's lineage up to its last committed state to the node
// at addr while the env goes on running, in rounds: after a round it
// waits (at most precopyWait) for the checkpoint of a turn that ran
// meanwhile and ships again, so that what migrate ships while the env
// waits is what it did in the last moments only.
func (t *Transfer) Precopy(ctx context.Context, envID, addr string) (MigrateStats, error) {
	start := time.Now()
	st := MigrateStats{Env: envID}
	env, err := t.o.Coordinator.Env(envID)
	if err != nil {
		return st, err
	}
	shipped := ""
	for round := 0; round < precopyRounds; round++ {
		head, err := t.o.Engine.CommittedHead(envID)
		if err != nil {
			return st, err
		}
		if head == shipped {
			break
		}
		if err := t.shipLineage(ctx, head, addr, &st); err != nil {
			return st, err
		}
		shipped = head
		// A turn's checkpoint still running: its state is next.
		for end := time.Now().Add(precopyWait); env.Head() != shipped && time.Now().Before(end); {
			if h, err := t.o.Engine.CommittedHead(envID); err != nil || h == env.Head() {
				break
			}
			select {
			case <-ctx.Done():
				return st, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	st.Took = time.Since(start)
	return st, nil
}

// The pre-copy's rounds and its wait for a checkpoint in progress.
const (
	precopyRounds = 3
	precopyWait   = 2 * time.Second
)

// Migrate moves env to the node at addr: it takes the env's ticket (the
// operations queued before it finish here, those after it wait), freezes
// the env at its last committed state, ships what the target lacks of
// its lineage, has the target adopt it at that state under the same id
// (the target's registry rewrites its placement), then closes it here.
// On failure the env thaws and stays here.
func (t *Transfer) Migrate(ctx context.Context, envID, addr string) (MigrateStats, error) {
	start := time.Now()
	st := MigrateStats{Env: envID}
	ctx, cancel := context.WithTimeout(ctx, t.o.Timeout)
	defer cancel()
	co := t.o.Coordinator
	wait, release := co.Ticket(envID)
	wait()
	defer release()
	paused := time.Now()
	env, err := co.Env(envID)
	if err != nil {
		return st, err
	}
	head, thaw, err := t.o.Engine.Freeze(ctx, env)
	if err != nil {
		return st, err
	}
	err = t.shipLineage(ctx, head, addr, &st)
	var keys []byte
	if k := t.o.StepKeys; err == nil && k != nil {
		keys, err = k.ExportStepKeys(envID)
	}
	if err == nil {
		var ok struct{}
		err = t.post(ctx, addr, "adopt", "application/json", jsonBody(AdoptRequest{Env: envID, State: head, Image: env.Image, Labels: env.Labels(), StepKeys: keys}), &ok)
	}
	if err != nil {
		thaw()
		return st, fmt.Errorf("migrate env %s to %s: %w", envID, addr, err)
	}
	st.Pause = time.Since(paused)
	if err := co.CloseEnv(context.Background(), envID); err != nil {
		t.log.Warn("close a migrated env", slog.String("env", envID), slog.Any("err", err))
	}
	if k := t.o.StepKeys; k != nil {
		k.ImportStepKeys(envID, nil) // they went with it
	}
	st.Took = time.Since(start)
	t.log.Info("migrated env", slog.String("env", envID), slog.String("to", addr), slog.String("state", head),
		slog.Int("states", st.States), slog.Int64("bytes", st.Bytes), slog.Duration("pause", st.Pause))
	return st, nil
}

// Migrate asks the node whose transfer endpoint is at from to run step
// ("precopy" or "migrate") of env's migration to the node at to.
func (c *ShipClient) Migrate(ctx context.Context, step, from, to, env string) (MigrateStats, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	t := &Transfer{o: TransferOptions{Token: c.Token}, cli: c.cli}
	var stats MigrateStats
	if err := t.post(ctx, from, step, "application/json", jsonBody(MigrateRequest{Env: env, To: to}), &stats); err != nil {
		return stats, fmt.Errorf("%s env %s from %s to %s: %w", step, env, from, to, err)
	}
	return stats, nil
}

// DrainStats describe a drain: the envs moved, each with its migration,
// and those that could not be moved, with why.
type DrainStats struct {
	Node   string            `json:"node"`
	Moved  map[string]string `json:"moved"` // env -> the node it went to
	Failed map[string]string `json:"failed,omitempty"`
	Pause  time.Duration     `json:"max_pause"`
	Took   time.Duration     `json:"took"`
}

// Drain moves every env of this node to other live nodes, one at a time,
// each to the least loaded node that serves transfers, is not draining
// and has room, as migrate moves an env (Precopy, then Migrate); the node
// is published as draining first, so no router places a new env on it.
// Requests that reach this node for an env that left are answered
// unknown_env, which a router sends on to the env's new node. ctx bounds
// the whole drain: envs not moved by then stay (and are reported).
func (t *Transfer) Drain(ctx context.Context) (DrainStats, error) {
	start := time.Now()
	ds := DrainStats{Moved: map[string]string{}, Failed: map[string]string{}}
	co, n := t.o.Coordinator, t.o.Node
	if co == nil || n == nil {
		return ds, errors.New("drain: this node is not a cluster node")
	}
	ds.Node = n.ID()
	if err := n.SetDraining(true); err != nil {
		t.log.Warn("publish draining", slog.Any("err", err))
	}
	placed := map[string]int{} // envs this drain sent to each node
	// Envs made here while it drains (the children of a branch already
	// under way) are moved in a later pass.
	for pass := 0; pass < drainPasses; pass++ {
		var left []string
		for _, e := range co.Envs(tenant.Admin(ctx)) {
			if _, failed := ds.Failed[e.Env.ID]; !failed {
				left = append(left, e.Env.ID)
			}
		}
		if len(left) == 0 {
			break
		}
		t.drainPass(ctx, left, placed, &ds)
	}
	ds.Took = time.Since(start)
	t.log.Info("drained", slog.Int("moved", len(ds.Moved)), slog.Int("failed", len(ds.Failed)), slog.Duration("took", ds.Took))
	for id, why := range ds.Failed {
		// Each on its own line: a SIGTERM's drain has no caller to read
		// DrainStats, and the env stays here to be closed.
		t.log.Warn("not drained", slog.String("env", id), slog.String("why", why))
	}
	if len(ds.Failed) > 0 {
		return ds, fmt.Errorf("drain: %d of %d envs not moved", len(ds.Failed), len(ds.Failed)+len(ds.Moved))
	}
	if n := len(co.Envs(tenant.Admin(ctx))); n > 0 {
		return ds, fmt.Errorf("drain: %d envs still here after %d passes (made while it drained)", n, drainPasses)
	}
	return ds, nil
}

// drainPasses bounds the passes of a drain over the node's envs.
const drainPasses = 5

// drainPass migrates the envs ids away, each to the least loaded other
// node with room.
func (t *Transfer) drainPass(ctx context.Context, ids []string, placed map[string]int, ds *DrainStats) {
	n := t.o.Node
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			ds.Failed[id] = "drain deadline: " + err.Error()
			continue
		}
		peers, err := n.Peers(ctx)
		if err != nil {
			ds.Failed[id] = err.Error()
			continue
		}
		var to NodeInfo
		best := 2.0
		for _, p := range peers {
			if p.ID == ds.Node || p.Draining || p.Transfer == "" || p.MaxEnvs <= 0 {
				continue
			}
			used := p.Envs + placed[p.ID]
			if used >= p.MaxEnvs {
				continue
			}
			if l := float64(used+1) / float64(p.MaxEnvs); l < best {
				to, best = p, l
			}
		}
		if to.ID == "" {
			ds.Failed[id] = "no other live node has room"
			continue
		}
		if _, err := t.Precopy(ctx, id, to.Transfer); err != nil {
			t.drainFailed(ds, id, err)
			continue
		}
		st, err := t.Migrate(ctx, id, to.Transfer)
		if err != nil {
			t.drainFailed(ds, id, err)
			continue
		}
		placed[to.ID]++
		ds.Moved[id] = to.ID
		ds.Pause = max(ds.Pause, st.Pause)
	}
}

// drainFailed records that env id was not moved, unless it is no longer
// open here: an env closed while the drain went over the others (its
// episode ended) has nothing left to move. The spot study saw drains
// report every such env as failed ("unknown env").
func (t *Transfer) drainFailed(ds *DrainStats, id string, err error) {
	if errors.Is(err, state.ErrUnknownEnv) {
		if _, gone := t.o.Coordinator.Env(id); gone != nil {
			t.log.Info("closed while draining", slog.String("env", id))
			return
		}
	}
	ds.Failed[id] = err.Error()
}

func (t *Transfer) serveDrain(w http.ResponseWriter, r *http.Request) {
	ds, err := t.Drain(r.Context())
	code := http.StatusOK
	if err != nil {
		code = http.StatusConflict
	}
	writeJSON(w, code, ds)
}

// Drain asks the node whose transfer endpoint is at addr to drain
// (Transfer.Drain), within timeout.
func (c *ShipClient) Drain(ctx context.Context, addr string, timeout time.Duration) (DrainStats, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+TransferPrefix+"drain", nil)
	if err != nil {
		return DrainStats{}, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.cli.Do(req)
	if err != nil {
		return DrainStats{}, fmt.Errorf("drain %s: %w", addr, err)
	}
	defer resp.Body.Close()
	var ds DrainStats
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(b, &ds); err != nil || resp.StatusCode == http.StatusUnauthorized {
		return ds, fmt.Errorf("drain %s: %s: %s", addr, resp.Status, strings.TrimSpace(string(b)))
	}
	if resp.StatusCode != http.StatusOK {
		return ds, fmt.Errorf("drain %s: %d envs not moved: %v", addr, len(ds.Failed), ds.Failed)
	}
	return ds, nil
}

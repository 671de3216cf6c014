package coordinator

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/arbor-env/arbor/internal/tenant"
	"github.com/arbor-env/arbor/state"
)

// Tenants (docs/security.md, "Tenants"): every env handed out belongs to
// the tenant of the request that made it (reset) or to its source's
// tenant (branch, promote); a state belongs to the tenant of the env that
// made it. The tenant a request acts for rides in its context (package
// tenant). This file is the one home of the rule: every look-up a client
// can reach by id (lookup, ownState) and every listing (Envs, Lost, Tree)
// asks sees, and answers another tenant's ids exactly as unknown ones.

// labelTenant is the label that keeps an env's tenant across a restart
// (recover.go) and after the env closed (its states' owner).
const labelTenant = "arbor.tenant"

// public owns the states of envs no tenant was handed (a task pool's
// templates and warm copies): every tenant's reset starts from them.
const public = "\x00public"

// owner is the tenant of env id: of an env handed out, the one it was
// handed to; of a closed env, the one its record's labels name; of an env
// never handed out, public. Answers are cached: an env's tenant never
// changes.
func (c *Coordinator) owner(id string) string {
	c.mu.Lock()
	if m, ok := c.envs[id]; ok {
		c.mu.Unlock()
		return m.tenant
	}
	if t, ok := c.owners[id]; ok {
		c.mu.Unlock()
		return t
	}
	l, lost := c.lost[id]
	c.mu.Unlock()
	t, found := public, false
	if lost {
		t, found = l.Labels[labelTenant], true
	} else if recs, err := c.e.EnvRecords(); err == nil {
		for _, r := range recs {
			if r.ID != id {
				continue
			}
			if t2, ok := r.Labels[labelTenant]; ok || r.Labels[labelServed] == "1" {
				t = t2
			}
			found = true
			break
		}
	} else {
		return "" // the records may read next time
	}
	if !found {
		return t // an id nobody made: not cached
	}
	c.mu.Lock()
	c.owners[id] = t
	c.mu.Unlock()
	return t
}

// sees reports whether ctx's tenant may see env id (handed out, lost or
// closed). Public envs are never handed out, so no id of one reaches here
// from a client's env_id.
func (c *Coordinator) sees(ctx context.Context, id string) bool {
	t := tenant.From(ctx)
	if t.Admin {
		return true
	}
	o := c.owner(id)
	return o == t.Name || o == public
}

// Sees reports whether the tenant ctx acts for may see and drive env id
// (callers outside the coordinator that keep envs of their own: the MCP
// endpoint's sessions, the OpenEnv endpoint's).
func (c *Coordinator) Sees(ctx context.Context, id string) bool {
	return tenant.From(ctx).Admin || c.owner(id) == tenant.From(ctx).Name
}

// foreignState reports whether sid is a state ctx's tenant does not see:
// one another tenant's env made, committed or still the pending head of
// that env. Callers answer it exactly as they answer a state nobody made.
func (c *Coordinator) foreignState(ctx context.Context, sid string) bool {
	if tenant.From(ctx).Admin || sid == "" {
		return false
	}
	if st, err := c.e.State(sid); err == nil {
		return !c.sees(ctx, st.Env)
	}
	for _, env := range c.e.Envs() {
		if env.Head() == sid {
			return !c.sees(ctx, env.ID)
		}
	}
	return false
}

// ownState answers a state ctx's tenant does not see as the engine
// answers a look-up of an id nobody made (branch, rollback, prepare).
func (c *Coordinator) ownState(ctx context.Context, sid string) error {
	if c.foreignState(ctx, sid) {
		return fmt.Errorf("%w: %s", state.ErrUnknownState, sid)
	}
	return nil
}

// childTenant is the tenant of the children of a branch: the source
// env's, else the tenant of the env that made the source state, else
// (a public state: a task's template) the requester's.
func (c *Coordinator) childTenant(ctx context.Context, parent *entry, sid string) string {
	if parent != nil {
		return parent.tenant
	}
	if st, err := c.e.State(sid); err == nil {
		if o := c.owner(st.Env); o != public {
			return o
		}
	}
	return tenant.From(ctx).Name
}

// everyTenant is the context of look-ups by callers that hold an env
// already (they were handed it, or they are the coordinator's own).
func everyTenant() context.Context {
	return tenant.Admin(context.Background())
}

// SeesEvent reports whether ctx's tenant sees the env an event is of
// (or, for a branch from a state, one of its children): the web view's
// event stream skips the others.
func (c *Coordinator) SeesEvent(ctx context.Context, ev Event) bool {
	if tenant.From(ctx).Admin {
		return true
	}
	if ev.Env != "" {
		return c.Sees(ctx, ev.Env)
	}
	for _, ch := range ev.Children {
		if c.Sees(ctx, ch) {
			return true
		}
	}
	return false
}

// OwnEnv answers state.ErrUnknownEnv, worded as lookup words an env nobody
// handed out, when ctx's tenant does not see env id: for what a caller
// keeps of envs outside the coordinator (the server's keyed steps).
func (c *Coordinator) OwnEnv(ctx context.Context, id string) error {
	if !c.Sees(ctx, id) {
		return fmt.Errorf("%w: no open env %q", state.ErrUnknownEnv, id)
	}
	return nil
}

// tenantEnvs is arbor_tenant_envs{tenant}: the envs handed out to each
// tenant that has any. Tenants come from the server's tokens file (one
// "" without it), so the label's values are few and configured.
type tenantEnvs struct{ c *Coordinator }

var tenantEnvsDesc = prometheus.NewDesc("arbor_tenant_envs", "Open envs handed out, by tenant (arbor serve --tokens).", []string{"tenant"}, nil)

func (t tenantEnvs) Describe(ch chan<- *prometheus.Desc) { ch <- tenantEnvsDesc }

func (t tenantEnvs) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	t.c.mu.Lock()
	for _, m := range t.c.envs {
		n[m.tenant]++
	}
	t.c.mu.Unlock()
	for name, v := range n {
		ch <- prometheus.MustNewConstMetric(tenantEnvsDesc, prometheus.GaugeValue, float64(v), name)
	}
}

package coordinator

import (
	"context"
	"fmt"

	"github.com/arbor-env/arbor/state"
)

// Adopt takes over env id, migrated here from another node of a cluster
// (docs/cluster.md, "Live migration"): its lineage up to head was
// imported (branch.Engine.Import), the engine restores it under the same
// id (AdoptImported), and it is registered as handed out with the task,
// seed and base turn its labels carry, as a crash restart adopts an env.
// Its hooks record it here (a cluster node rewrites its placement).
func (c *Coordinator) Adopt(ctx context.Context, id, head, image string, labels map[string]string) error {
	_, err := c.adopt(ctx, id, head, image, labels)
	return err
}

// AdoptRecovered is Adopt for an env whose node died, restored here
// from its replica: what it did after head is gone, and its first
// operation here says so (TurnResult.Recovered), as after a crash
// restart, so that a client can tell the env went back.
func (c *Coordinator) AdoptRecovered(ctx context.Context, id, head, image string, labels map[string]string) error {
	m, err := c.adopt(ctx, id, head, image, labels)
	if err != nil {
		return err
	}
	// Set once the env is registered: nothing reads it before adopt
	// answers (the router sends the env's requests here only then).
	m.recovered = &Recovered{StateID: head, Turn: m.env.Turn() - m.base}
	return nil
}

func (c *Coordinator) adopt(ctx context.Context, id, head, image string, labels map[string]string) (*entry, error) {
	if c.Has(id) {
		return nil, fmt.Errorf("%w: env %s is handed out here already", state.ErrInvalid, id)
	}
	if err := c.reserve(1); err != nil {
		return nil, err
	}
	defer c.unreserve(1)
	env, err := c.e.AdoptImported(ctx, id, head, image, labels)
	if err != nil {
		return nil, err
	}
	task, base, seed := fromLabels(env.Labels())
	m := c.register(env, task, seed, base, false, env.Labels()[labelTenant])
	if line, err := c.e.Lineage(head); err == nil {
		for _, st := range line {
			c.o.Hooks.StateMade(st.Env, st.ID)
		}
	}
	c.publish(Event{Type: EventReset, Env: id, Task: task.Name, State: head})
	return m, nil
}

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
	if c.Has(id) {
		return fmt.Errorf("%w: env %s is handed out here already", state.ErrInvalid, id)
	}
	if err := c.reserve(1); err != nil {
		return err
	}
	defer c.unreserve(1)
	env, err := c.e.AdoptImported(ctx, id, head, image, labels)
	if err != nil {
		return err
	}
	task, base, seed := fromLabels(env.Labels())
	c.register(env, task, seed, base, false, env.Labels()[labelTenant])
	if line, err := c.e.Lineage(head); err == nil {
		for _, st := range line {
			c.o.Hooks.StateMade(st.Env, st.ID)
		}
	}
	c.publish(Event{Type: EventReset, Env: id, Task: task.Name, State: head})
	return nil
}

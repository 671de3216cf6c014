package sandbox

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/arbor-env/arbor/sandbox/ctl"
)

// DescribeTasks exposes the task list KillAllButInit puts in its timeout
// error.
func DescribeTasks(s *Sandbox) string { return s.describeTasks() }

// ShellWireJSON is c as init decodes it from the request Start sends, or
// an error when ShellConfig and ctl.Shell no longer have the same fields.
func ShellWireJSON(c ShellConfig) (ctl.Shell, error) {
	if n, m := reflect.TypeFor[ShellConfig]().NumField(), reflect.TypeFor[ctl.Shell]().NumField(); n != m {
		return ctl.Shell{}, fmt.Errorf("ShellConfig has %d fields, ctl.Shell %d", n, m)
	}
	w := c.wire()
	b, err := json.Marshal(ctl.Request{Op: ctl.OpShell, Shell: &w})
	if err != nil {
		return ctl.Shell{}, err
	}
	var req ctl.Request
	if err := json.Unmarshal(b, &req); err != nil {
		return ctl.Shell{}, err
	}
	if req.Shell == nil {
		return ctl.Shell{}, fmt.Errorf("no shell config in %s", b)
	}
	return *req.Shell, nil
}

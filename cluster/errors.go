package cluster

import (
	"errors"

	"github.com/arbor-env/arbor/state"
)

var (
	// ErrNodeIDTaken: another live node is registered under the same id.
	ErrNodeIDTaken = errors.New("node id taken by a live node")
	// ErrUnavailable: etcd did not answer.
	ErrUnavailable = state.New(state.ErrUnavailable, "etcd unavailable")
	// ErrNoNode: no live node can take the request.
	ErrNoNode = errors.New("no live node")
)

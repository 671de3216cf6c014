// Package cluster keeps the state of a cluster of Arbor nodes in etcd:
// which nodes are alive (a key per node under a lease the node keeps
// alive), their capacity and load, which node holds each env handed out,
// and which nodes hold each state's artifacts. It runs no consensus or
// membership protocol of its own: etcd's leases, transactions and
// watches are the whole of it.
//
// A node (arbor serve --cluster-etcd) publishes with a Node: Connect
// before its coordinator exists (the Node is the coordinator's Hooks),
// Register once it serves, Leave when it stops. Its Transfer serves and
// sends states between nodes and runs migrations (transfer.go). A router
// (package router) reads the cluster with a View and drives transfers
// with a ShipClient. The key layout is in keys.go and docs/cluster.md.
//
// Lock order: Node.mu is a leaf (no etcd call is made while it is held);
// so is View.mu.
package cluster

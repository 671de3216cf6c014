// Package sandbox runs Arbor sandboxes: a root file system (a writable
// clone made by a cr.Snapshotter) entered in new mount, pid, uts, ipc and
// net namespaces, limited by its own cgroups, with arbor-init as pid 1 and a
// persistent shell in which every command runs.
package sandbox

// Package imgcache keeps CRIU process image directories, bounded in bytes:
// the most recently used images live in a memory-backed directory (tmpfs) so
// restores read them at memory speed, the rest on disk. Evicting an image
// moves it to disk; acquiring one that is on disk copies it back first. An
// acquired image is pinned and never evicted until released, so a branch can
// restore n children from one image in parallel.
//
// Layout: HotDir/<id> and ColdDir/<id> hold committed images. NewDir hands
// out HotDir/.new-<id>, renamed to HotDir/<id> on Commit; copies are written
// to .tmp-<id>-* names and renamed into place. Open deletes every .new- and
// .tmp- leftover, so a crash never leaves a half-written image under a real
// id.
package imgcache

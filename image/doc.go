// Package image builds and keeps Arbor's root filesystem images. An image is
// a read-only snapshot named "images/<name>" in a cr.Snapshotter; a sandbox
// root is a writable clone of it. Each image carries its metadata inside the
// snapshot at /.arbor-image.json, so an image and its description are made
// (and removed) by one atomic snapshot operation.
package image

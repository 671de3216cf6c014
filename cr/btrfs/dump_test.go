package btrfs

import (
	"slices"
	"strings"
	"testing"
)

func TestParseDump(t *testing.T) {
	in := `snapshot        ./s2                            uuid=9950b7c8 transid=8 parent_uuid=536e6dea parent_transid=7
utimes          ./s2/d                          atime=2020-01-01T00:00:00+0000 mtime=2020-01-01T00:00:00+0000 ctime=2026-11-30T00:05:24+0000
rename          ./s2/dd                         dest=./s2/ee
update_extent   ./s2/a                          offset=0 len=4
unlink          ./s2/b
mkfile          ./s2/o265-8-0
rename          ./s2/o265-8-0                   dest=./s2/with\ space
link            ./s2/hl                         dest=new
write           ./s2/tab\there\134x             offset=0 len=3
utimes          ./s2/                           atime=2026-11-30T00:05:24+0000
`
	ops, err := parseDump(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []dumpOp{
		{cmd: "utimes", path: "/d"},
		{cmd: "rename", path: "/dd", dest: "/ee"},
		{cmd: "update_extent", path: "/a"},
		{cmd: "unlink", path: "/b"},
		{cmd: "mkfile", path: "/o265-8-0"},
		{cmd: "rename", path: "/o265-8-0", dest: "/with space"},
		{cmd: "link", path: "/hl"},
		{cmd: "write", path: "/tab\there\\x"},
		{cmd: "utimes", path: "/"},
	}
	if !slices.Equal(ops, want) {
		t.Fatalf("got\n%q\nwant\n%q", ops, want)
	}
}

func TestParseDumpRejectsMissingHeader(t *testing.T) {
	if _, err := parseDump(strings.NewReader("unlink ./s/b\n")); err == nil {
		t.Fatal("want an error for a stream without its snapshot line")
	}
}

// Package imgcompare compares two sets of CRIU images field by field: the
// skip fuzzer's second oracle (docs/inspector.md, "The CRIU oracle"). It
// decodes every image with go-criu's crit, flattens each entry into
// leaves (a field path and its value), drops or renumbers the few fields
// that differ between two dumps of equal trees (rules.go, each with its
// reason), and reports the rest of what differs with its image file and
// field path.
package imgcompare

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/cli"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Image is one decoded image file: its entries, in file order.
type Image struct {
	Magic   string
	Entries []proto.Message
	// Extra is each entry's payload as crit shows it (a pipe's data, a
	// queued message), "" when it has none.
	Extra []string
}

// Set is a dump's images by file name.
type Set map[string]*Image

// Diff is one field that differs: its value in the first set (A) and the
// second (B), "<absent>" where that set has none.
type Diff struct {
	File, Field string
	A, B        string
}

func (d Diff) String() string { return fmt.Sprintf("%s %s: %s != %s", d.File, d.Field, d.A, d.B) }

// Absent is the value of a field or file one set does not have.
const Absent = "<absent>"

// skipFile reports the image files a comparison never reads: memory
// contents (pages, and the pagemap that indexes them: what a process
// holds in memory is not what a skip keeps, docs/inspector.md), CRIU's
// own statistics of the run (times), and the dump's log.
func skipFile(name string) bool {
	for _, p := range []string{"pages-*.img", "pagemap-*.img", "stats-*.img", "*.log"} {
		if ok, _ := filepath.Match(p, name); ok {
			return true
		}
	}
	return !strings.HasSuffix(name, ".img")
}

// Load decodes the images in dir.
func Load(dir string) (Set, error) {
	names, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read images: %w", err)
	}
	s := Set{}
	for _, n := range names {
		if !n.Type().IsRegular() || skipFile(n.Name()) {
			continue
		}
		img, err := loadImage(filepath.Join(dir, n.Name()))
		if err != nil {
			return nil, fmt.Errorf("decode %s: %w", n.Name(), err)
		}
		s[n.Name()] = img
	}
	return s, nil
}

func loadImage(path string) (*Image, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	typ, err := cli.GetEntryTypeFromImg(f)
	if err != nil {
		return nil, err
	}
	ci, err := crit.New(f, nil, "", false, false).Decode(typ)
	if err != nil {
		return nil, err
	}
	img := &Image{Magic: ci.Magic}
	for _, e := range ci.Entries {
		if e.Message == nil {
			continue
		}
		img.Entries = append(img.Entries, e.Message)
		img.Extra = append(img.Extra, e.Extra)
	}
	return img, nil
}

// Options name what the two sets are expected to differ in by design.
type Options struct {
	// RenameA and RenameB are replaced by "<env>" in every string of A
	// and B: each tree's env id, in the cgroup and mount paths that name
	// it.
	RenameA, RenameB string
}

// Compare returns what differs between a and b once the rules have
// dropped and renumbered what legitimately differs, sorted by file and
// field.
func Compare(a, b Set, o Options) []Diff {
	la, lb := a.leaves(o.RenameA), b.leaves(o.RenameB)
	var diffs []Diff
	for f := range la {
		if _, ok := lb[f]; !ok {
			diffs = append(diffs, Diff{File: f, Field: "", A: "present", B: Absent})
		}
	}
	for f := range lb {
		if _, ok := la[f]; !ok {
			diffs = append(diffs, Diff{File: f, Field: "", A: Absent, B: "present"})
		}
	}
	for f, fa := range la {
		fb, ok := lb[f]
		if !ok {
			continue
		}
		for k, va := range fa {
			vb, ok := fb[k]
			if !ok {
				vb = Absent
			}
			if va != vb {
				diffs = append(diffs, Diff{File: f, Field: k, A: va, B: vb})
			}
		}
		for k, vb := range fb {
			if _, ok := fa[k]; !ok {
				diffs = append(diffs, Diff{File: f, Field: k, A: Absent, B: vb})
			}
		}
	}
	sort.Slice(diffs, func(i, j int) bool {
		if diffs[i].File != diffs[j].File {
			return diffs[i].File < diffs[j].File
		}
		return diffs[i].Field < diffs[j].Field
	})
	return diffs
}

// leaves flattens every image of s into field path -> value, per file,
// with the rules applied.
func (s Set) leaves(rename string) map[string]map[string]string {
	out := map[string]map[string]string{}
	rn := newRenumber()
	files := make([]string, 0, len(s))
	for f := range s {
		files = append(files, f)
	}
	slices.Sort(files) // renumbering follows a fixed order
	for _, f := range files {
		img := s[f]
		m := map[string]string{}
		for i, e := range img.Entries {
			key := entryKey(img.Magic, e, i)
			// The entry's own leaves first: a rule may look at its
			// other fields (the name of the file whose flags it is).
			var paths []string
			entry := map[string]string{}
			flatten(e.ProtoReflect(), "", func(path, val string) {
				if rename != "" {
					val = strings.ReplaceAll(val, rename, "<env>")
				}
				paths = append(paths, path)
				entry[path] = val
			})
			slices.Sort(paths) // renumbering follows a fixed order
			for _, p := range paths {
				if v, ok := apply(rn, img.Magic, p, entry[p], entry); ok {
					m[key+p] = v
				}
			}
			if x := img.Extra[i]; x != "" {
				m[key+".extra"] = x
			}
		}
		out[rn.fileName(f)] = m
	}
	return out
}

// entryKey names an entry by what identifies it, when it has that field
// (an fd by its number, a file by its id, a mount by its mount point):
// an entry one set lacks then shows as that entry, not as a shift of
// every entry after it. Else by its index.
func entryKey(magic string, e proto.Message, i int) string {
	m := e.ProtoReflect()
	names := []protoreflect.Name{"fd", "tfd", "id"}
	if magic == "MNTS" {
		names = []protoreflect.Name{"mountpoint"}
	}
	for _, name := range names {
		if fd := m.Descriptor().Fields().ByName(name); fd != nil && m.Has(fd) && fd.Cardinality() != protoreflect.Repeated {
			return fmt.Sprintf("[%s=%v]", name, m.Get(fd).Interface())
		}
	}
	return fmt.Sprintf("[%d]", i)
}

// flatten calls leaf for every set scalar of m under prefix, with paths
// like "[id=3].reg.pos" and "[0].tc.rlimits.rlimits[7].cur".
func flatten(m protoreflect.Message, prefix string, leaf func(path, val string)) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := prefix + "." + string(fd.Name())
		switch {
		case fd.IsList():
			l := v.List()
			leaf(p+".len", fmt.Sprint(l.Len()))
			for i := 0; i < l.Len(); i++ {
				k := fmt.Sprintf("%s[%d]", p, i)
				if fd.Kind() == protoreflect.MessageKind {
					// Elements with a key (an epoll's targets by fd)
					// in whatever order the kernel listed them.
					k = p + entryKey("", l.Get(i).Message().Interface(), i)
				}
				value(fd, l.Get(i), k, leaf)
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				value(fd.MapValue(), mv, fmt.Sprintf("%s[%v]", p, k.Interface()), leaf)
				return true
			})
		default:
			value(fd, v, p, leaf)
		}
		return true
	})
}

func value(fd protoreflect.FieldDescriptor, v protoreflect.Value, p string, leaf func(path, val string)) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		flatten(v.Message(), p, leaf)
	case protoreflect.BytesKind:
		leaf(p, fmt.Sprintf("%x", v.Bytes()))
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			leaf(p, string(ev.Name()))
		} else {
			leaf(p, fmt.Sprint(v.Enum()))
		}
	default:
		leaf(p, fmt.Sprint(v.Interface()))
	}
}

// Package imgcompare compares two sets of CRIU images field by field: the
// skip fuzzer's second oracle (docs/inspector.md, "The CRIU oracle"). It
// decodes every image with go-criu's crit, flattens each entry into
// leaves (a field path and its value), drops or renumbers the few fields
// that differ between two dumps of equal trees (rules.go, each with its
// reason), and reports the rest of what differs with its image file and
// field path.
package imgcompare

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/cli"
	ghost_file "github.com/checkpoint-restore/go-criu/v7/crit/images/ghost-file"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/vma"
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
	// Raw, for an image crit cannot decode, is a digest of its bytes.
	Raw string
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
	magic, err := crit.ReadMagic(f)
	if err != nil {
		return nil, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	ghost := magic == "GHOST_FILE"
	// crit reads a ghost file's content (when not in chunks) 8 bytes too
	// long, leaving out the image's two magic numbers, and fails on an
	// empty one: its content is read here instead.
	ci, err := crit.New(f, nil, "", false, ghost).Decode(typ)
	if err != nil && magic == "IPCNS_SHM" {
		// crit reads each segment's content after its entry, where CRIU
		// 4 keeps it in the pages images (in_pagemaps) and fails. The
		// image holds no time nor kernel number a restore changes
		// (key, id, owner, mode, size): its bytes are compared.
		b, rerr := os.ReadFile(path)
		if rerr != nil {
			return nil, rerr
		}
		return &Image{Magic: magic, Entries: []proto.Message{}, Raw: fmt.Sprintf("sha256 %x", sha256.Sum256(b))}, nil
	}
	if err != nil {
		return nil, err
	}
	img := &Image{Magic: ci.Magic}
	if ghost && len(ci.Entries) == 1 {
		g := ci.Entries[0].Message.(*ghost_file.GhostFileEntry)
		if !g.GetChunks() {
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, err
			}
			if head := 8 + 4 + proto.Size(g); head <= len(b) {
				ci.Entries[0].Extra = fmt.Sprintf("content sha256 %x", sha256.Sum256(b[head:]))
			}
		}
	}
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
	// and B: each tree's sandbox id, which names its cgroup and its
	// root's subvolume (in cgroup.img and the mount options).
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
	// CRIU numbers files, and the images that hold a task's
	// descriptors, in the order it walks the tree, which differs between
	// two equal trees (a restored init lists its children in the order
	// CRIU forked them): files go by a label of what they are, the
	// descriptor images by the pid of their first task.
	rn.files = fileLabels(s)
	rn.fdinfo = fdinfoOwners(s)
	initThreads := initThreads(s)
	files := make([]string, 0, len(s))
	for f := range s {
		files = append(files, f)
	}
	// Renumbering follows a fixed order: files.img first, its entries
	// by label.
	slices.SortFunc(files, func(a, b string) int {
		if (a == "files.img") != (b == "files.img") {
			if a == "files.img" {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	for _, f := range files {
		img := s[f]
		if initThreads[f] {
			continue
		}
		m := map[string]string{}
		order := make([]int, len(img.Entries))
		for i := range order {
			order[i] = i
		}
		if img.Magic == "FILES" {
			slices.SortStableFunc(order, func(i, j int) int {
				return strings.Compare(rn.fileLabel(img.Entries[i]), rn.fileLabel(img.Entries[j]))
			})
		}
		for _, i := range order {
			e := img.Entries[i]
			if mme, ok := e.(*mm.MmEntry); ok {
				e = mergeVMAs(mme)
			}
			key := entryKey(img.Magic, e, i)
			if img.Magic == "FILES" {
				key = "[" + rn.fileLabel(e) + "]"
			}
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
				if v, ok := apply(rn, f, img.Magic, p, entry[p], entry); ok {
					m[key+p] = v
				}
			}
			if x := img.Extra[i]; x != "" {
				m[key+".extra"] = x
			}
		}
		if img.Raw != "" {
			m["(bytes)"] = img.Raw
		}
		out[rn.fileName(f)] = m
	}
	return out
}

// fileLabels names each entry of files.img by its id: its type and name
// (a path, for what has one) and the first descriptor that holds it
// ("@13:3", fd 3 of pid 13); files no descriptor holds (a cwd, an
// executable), of equal label, in the order of what they are (their
// flattened fields but ids and kernel numbers).
func fileLabels(s Set) map[string]string {
	img := s["files.img"]
	if img == nil {
		return nil
	}
	holders := fileHolders(s)
	type file struct{ id, label, what string }
	var fs []file
	for _, e := range img.Entries {
		m := e.ProtoReflect()
		idf := m.Descriptor().Fields().ByName("id")
		if idf == nil || !m.Has(idf) {
			continue
		}
		var what []string
		label := ""
		flatten(m, "", func(path, val string) {
			switch {
			case path == ".type":
				label = val + label
			case strings.HasSuffix(path, ".name") && strings.Count(path, ".") == 2:
				name, _ := apply(nil, "files.img", "FILES", path, val, nil)
				label += ":" + name
			}
			if lastField(path) == "id" || strings.HasSuffix(path, "_id") || ruleFor("FILES", path) {
				return
			}
			what = append(what, path+"="+val)
		})
		slices.Sort(what)
		id := fmt.Sprint(m.Get(idf).Interface())
		if h, ok := holders[id]; ok {
			label += "@" + h
		}
		fs = append(fs, file{id: id, label: label, what: strings.Join(what, " ")})
	}
	slices.SortStableFunc(fs, func(a, b file) int {
		if c := strings.Compare(a.label, b.label); c != 0 {
			return c
		}
		return strings.Compare(a.what, b.what)
	})
	out := map[string]string{}
	seen := map[string]int{}
	for _, f := range fs {
		seen[f.label]++
		if strings.Contains(f.label, "@") {
			out[f.id] = f.label
		} else {
			out[f.id] = fmt.Sprintf("%s#%d", f.label, seen[f.label])
		}
	}
	return out
}

// mergeVMAs returns m with adjacent mappings of the same kind (the same
// file at contiguous offsets, protection, flags and status) as one: where
// the kernel splits a mapping is its bookkeeping. A live process keeps
// the split an mprotect made (a library's RELRO, written before it was
// made read-only, beside the read-only part), where its restore maps
// both parts as one; a restored heap may come in two parts. CRIU records
// anonymous memory at offset 0.
func mergeVMAs(m *mm.MmEntry) *mm.MmEntry {
	m = proto.Clone(m).(*mm.MmEntry)
	var out []*vma.VmaEntry
	for _, v := range m.GetVmas() {
		if n := len(out); n > 0 {
			p := out[n-1]
			if p.GetEnd() == v.GetStart() && p.GetShmid() == v.GetShmid() && p.GetProt() == v.GetProt() &&
				p.GetFlags() == v.GetFlags() && p.GetStatus() == v.GetStatus() && p.GetMadv() == v.GetMadv() &&
				p.GetFdflags() == v.GetFdflags() && (p.GetPgoff()+(p.GetEnd()-p.GetStart()) == v.GetPgoff() ||
				p.GetShmid() == 0 && p.GetPgoff() == 0 && v.GetPgoff() == 0) {
				p.End = proto.Uint64(v.GetEnd())
				continue
			}
		}
		out = append(out, v)
	}
	m.Vmas = out
	return m
}

// initThreads are the core images of init's threads but its first:
// init is Arbor's Go program, whose runtime starts threads as it needs
// them (a live init may have one more than its restored image).
func initThreads(s Set) map[string]bool {
	out := map[string]bool{}
	img := s["pstree.img"]
	if img == nil {
		return out
	}
	for _, e := range img.Entries {
		p, ok := e.(*pstree.PstreeEntry)
		if !ok || p.GetPid() != 1 {
			continue
		}
		for _, t := range p.GetThreads() {
			if t != 1 {
				out[fmt.Sprintf("core-%d.img", t)] = true
			}
		}
	}
	return out
}

// fileHolders maps a file id to the first descriptor that holds it,
// "pid:fd", by pid and then fd.
func fileHolders(s Set) map[string]string {
	owners := fdinfoOwners(s)
	type holder struct{ pid, fd int }
	best := map[string]holder{}
	for name, img := range s {
		var tid int
		if _, err := fmt.Sscanf(name, "fdinfo-%d.img", &tid); err != nil {
			continue
		}
		var pid int
		if _, err := fmt.Sscanf(owners[fmt.Sprint(tid)], "%d", &pid); err != nil {
			continue
		}
		for _, e := range img.Entries {
			m := e.ProtoReflect()
			idf, fdf := m.Descriptor().Fields().ByName("id"), m.Descriptor().Fields().ByName("fd")
			if idf == nil || fdf == nil || !m.Has(idf) || !m.Has(fdf) {
				continue
			}
			id := fmt.Sprint(m.Get(idf).Interface())
			h := holder{pid, int(m.Get(fdf).Uint())}
			if b, ok := best[id]; !ok || h.pid < b.pid || h.pid == b.pid && h.fd < b.fd {
				best[id] = h
			}
		}
	}
	out := map[string]string{}
	for id, h := range best {
		out[id] = fmt.Sprintf("%d:%d", h.pid, h.fd)
	}
	// Files no descriptor holds: a task's cwd and root, by the first
	// task's pid.
	for _, ref := range []struct{ image, field, what string }{{"fs-%d.img", "cwd_id", "cwd"}, {"fs-%d.img", "root_id", "root"}} {
		first := map[string]int{}
		for name, img := range s {
			var pid int
			if _, err := fmt.Sscanf(name, ref.image, &pid); err != nil || len(img.Entries) == 0 {
				continue
			}
			m := img.Entries[0].ProtoReflect()
			fd := m.Descriptor().Fields().ByName(protoreflect.Name(ref.field))
			if fd == nil || !m.Has(fd) {
				continue
			}
			id := fmt.Sprint(m.Get(fd).Interface())
			if p, ok := first[id]; !ok || pid < p {
				first[id] = pid
			}
		}
		for id, pid := range first {
			if _, ok := out[id]; !ok {
				out[id] = fmt.Sprintf("%s:%d", ref.what, pid)
			}
		}
	}
	return out
}

// fdinfoOwners maps a files id (fdinfo-<id>.img) to the smallest pid of
// the tasks that share that descriptor table (ids-<pid>.img).
func fdinfoOwners(s Set) map[string]string {
	out := map[string]string{}
	for name, img := range s {
		var pid int
		if _, err := fmt.Sscanf(name, "ids-%d.img", &pid); err != nil || img.Magic != "IDS" || len(img.Entries) == 0 {
			continue
		}
		m := img.Entries[0].ProtoReflect()
		fd := m.Descriptor().Fields().ByName("files_id")
		if fd == nil || !m.Has(fd) {
			continue
		}
		id := fmt.Sprint(m.Get(fd).Interface())
		if old, ok := out[id]; ok {
			var o int
			fmt.Sscanf(old, "%d", &o)
			if o < pid {
				continue
			}
		}
		out[id] = fmt.Sprint(pid)
	}
	return out
}

// keyField is the field that identifies an entry of an image (an fd by
// its number, a file by its id, a mount by its mount point): an entry one
// set lacks then shows as that entry, not as a shift of every entry after
// it. Other entries go by their index.
var keyField = map[string]protoreflect.Name{
	"FDINFO":   "fd",
	"PSTREE":   "pid",
	"TTY_INFO": "id",
	"MNTS":     "mountpoint",
	"epoll":    "tfd", // an epoll's targets, in the order the kernel lists them
}

func entryKey(magic string, e proto.Message, i int) string {
	m := e.ProtoReflect()
	if name, ok := keyField[magic]; ok {
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
				if fd.Kind() == protoreflect.MessageKind && fd.Name() == "tfd" {
					k = p + entryKey("epoll", l.Get(i).Message().Interface(), i)
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

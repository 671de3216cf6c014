// Package imgdelta stores a CRIU process image as a delta on top of an
// earlier one, by content: the pages of a process's private memory that
// are byte for byte what the same process held at the same address in the
// base image are left out and marked "in parent" in its pagemap, the way
// CRIU's own incremental dumps mark them, and CRIU's restore reads them
// through the image directory's "parent" link. CRIU's incremental dumps
// find unchanged pages with the kernel's soft-dirty tracking, which the
// kernels Arbor runs on may lack; comparing the pages after a whole dump
// needs nothing from the kernel and is exact by construction
// (docs/engine.md, "Delta images").
//
// Only pagemap-<pid>.img and its pages file change; every other file of
// the image is CRIU's as dumped. Flatten writes a delta back out as a
// whole image, for a reader that has no chain (another node).
package imgdelta

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/checkpoint-restore/go-criu/v7/crit"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/mm"
	"github.com/checkpoint-restore/go-criu/v7/crit/images/pagemap"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// ErrDamaged is Make's error when it failed after it began to rename its
// files into place: the image is neither whole nor a delta any more.
var ErrDamaged = errors.New("image damaged")

// MaxChain bounds the delta images a chain may hold on one whole image:
// the image cache follows no longer one (a guard against a damaged
// store's loop), the engine makes none longer.
const MaxChain = 64

// ParentLink is the name of CRIU's link from an image directory to the
// one it is a delta of.
const ParentLink = "parent"

// Pagemap entry flags (CRIU's images/pagemap.proto, criu/include/pagemap.h).
const (
	flagParent  = 1 << 0 // the pages are in the parent image
	flagLazy    = 1 << 1 // the pages may be restored lazily
	flagPresent = 1 << 2 // the pages are in this image's pages file
)

var pageSize = int64(os.Getpagesize())

// pagemapName matches a process's pagemap (not the shared memory ones,
// pagemap-shmem-*.img, which are left whole).
var pagemapName = regexp.MustCompile(`^pagemap-([0-9]+)\.img$`)

// Stats says what Make did.
type Stats struct {
	// Pages is how many pages of the processes the base holds were
	// compared; Kept how many of them stay in the delta (the rest are
	// left to the base).
	Pages, Kept int64
	// Before and After are the bytes of the rewritten pages files before
	// and after (a process the base does not hold is in neither). When
	// Kept is Pages, nothing was left to the base and the image stays
	// whole, with no parent link.
	Before, After int64
}

// Delta reports whether Make left pages to the base: the image became a
// delta (else it stayed whole).
func (st Stats) Delta() bool { return st.Kept < st.Pages }

// Base returns the id of the image the image in dir is a delta of (the
// last element of its parent link), or "" for a whole image.
func Base(dir string) (string, error) {
	t, err := os.Readlink(filepath.Join(dir, ParentLink))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("image %s: parent link: %w", dir, err)
	}
	return filepath.Base(t), nil
}

// Make rewrites the whole image CRIU dumped into dir as a delta on top of
// the image in baseDir, whose id (its directory's name beside dir in the
// image store) is baseID: every page equal to the one at the same address
// of the same process in the base (read through the base's own chain) is
// left to it, and dir gets a relative parent link ../baseID, so the base
// must sit beside dir whenever CRIU reads dir. A process the base does
// not hold stays whole. The new files are written under temporary names
// and renamed into place only once all are written: on an error dir is
// left the whole image it was.
func Make(dir, baseDir, baseID string) (Stats, error) {
	var st Stats
	if baseID == "" || strings.ContainsRune(baseID, '/') {
		return st, fmt.Errorf("delta image: bad base id %q", baseID)
	}
	if old, err := Base(dir); err != nil {
		return st, err
	} else if old != "" {
		return st, fmt.Errorf("delta image %s: already a delta of %s", dir, old)
	}
	pids, err := pagemaps(dir)
	if err != nil {
		return st, err
	}
	var staged []staging
	defer func() {
		for _, s := range staged {
			os.Remove(s.tmp)
		}
	}()
	for _, pid := range pids {
		s, err := makeOne(dir, baseDir, pid, &st)
		staged = append(staged, s...)
		if err != nil {
			return st, fmt.Errorf("delta image %s, process %d: %w", dir, pid, err)
		}
	}
	if !st.Delta() {
		return st, nil // nothing to leave to the base: dir stays whole
	}
	if err := os.Symlink(filepath.Join("..", baseID), filepath.Join(dir, ParentLink)); err != nil {
		return st, fmt.Errorf("delta image %s: %w", dir, err)
	}
	for len(staged) > 0 {
		s := staged[0]
		if err := os.Rename(s.tmp, s.path); err != nil {
			// Half renamed: no longer the whole image, nor a delta.
			return st, fmt.Errorf("delta image %s: %w: %w", dir, ErrDamaged, err)
		}
		staged = staged[1:]
	}
	return st, nil
}

// staging is a file written under a temporary name, to be renamed to path.
type staging struct{ tmp, path string }

// pagemaps lists the pids of dir's process pagemaps, in order.
func pagemaps(dir string) ([]int, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("image %s: %w", dir, err)
	}
	var pids []int
	for _, e := range ents {
		if m := pagemapName.FindStringSubmatch(e.Name()); m != nil {
			pid, err := strconv.Atoi(m[1])
			if err != nil {
				return nil, fmt.Errorf("image %s: %s: %w", dir, e.Name(), err)
			}
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids, nil
}

// entry is one pagemap entry: nr pages from vaddr, with flags; off is the
// index of its first page in the pages file when present.
type entry struct {
	vaddr uint64
	nr    int64
	flags uint32
	off   int64
}

func (e entry) end() uint64 { return e.vaddr + uint64(e.nr*pageSize) }

// pagemapFile is a decoded pagemap: its pages file's id and its entries.
type pagemapFile struct {
	pagesID uint32
	entries []entry
}

// decode reads the CRIU image file at path (crit).
func decode(path string, entry proto.Message) (*crit.CriuImage, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	img, err := crit.New(f, nil, "", false, false).Decode(entry)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	return img, nil
}

func readPagemap(path string) (pagemapFile, error) {
	img, err := decode(path, &pagemap.PagemapEntry{})
	if err != nil {
		return pagemapFile{}, err
	}
	if img.Magic != "PAGEMAP" || len(img.Entries) == 0 {
		return pagemapFile{}, fmt.Errorf("decode %s: not a pagemap (magic %q, %d entries)", path, img.Magic, len(img.Entries))
	}
	head, ok := img.Entries[0].Message.(*pagemap.PagemapHead)
	if !ok {
		return pagemapFile{}, fmt.Errorf("decode %s: no pagemap head", path)
	}
	pm := pagemapFile{pagesID: head.GetPagesId()}
	var off int64
	for _, ce := range img.Entries[1:] {
		pe, ok := ce.Message.(*pagemap.PagemapEntry)
		if !ok {
			return pagemapFile{}, fmt.Errorf("decode %s: entry of type %T", path, ce.Message)
		}
		fl := pe.GetFlags()
		if pe.GetInParent() {
			fl |= flagParent
		}
		e := entry{vaddr: pe.GetVaddr(), nr: nrPages(pe), flags: fl, off: -1}
		if present(fl) {
			e.off = off
			off += e.nr
		}
		pm.entries = append(pm.entries, e)
	}
	return pm, nil
}

// nrPagesField is the pagemap entry's 64-bit page count. CRIU 4 writes it
// and leaves field 2 (now compat_nr_pages) 0; go-criu's pagemap.proto
// predates it, so it is read from and written to the unknown fields.
const nrPagesField = 5

// nrPages is pe's page count: field 5 when present, else field 2.
func nrPages(pe *pagemap.PagemapEntry) int64 {
	b := pe.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			break
		}
		b = b[n:]
		if num == nrPagesField && typ == protowire.VarintType {
			if v, m := protowire.ConsumeVarint(b); m > 0 {
				return int64(v)
			}
			break
		}
		if m := protowire.ConsumeFieldValue(num, typ, b); m >= 0 {
			b = b[m:]
		} else {
			break
		}
	}
	return int64(pe.GetNrPages())
}

// present reports whether an entry's pages are in its own pages file.
func present(fl uint32) bool { return fl&flagPresent != 0 && fl&flagParent == 0 }

func encodePagemap(pm pagemapFile) func(*os.File) error {
	img := &crit.CriuImage{Magic: "PAGEMAP"}
	id := pm.pagesID
	img.Entries = append(img.Entries, &crit.CriuEntry{Message: &pagemap.PagemapHead{PagesId: &id}})
	for _, e := range pm.entries {
		v, compat, fl := e.vaddr, uint32(0), e.flags
		pe := &pagemap.PagemapEntry{Vaddr: &v, NrPages: &compat, Flags: &fl}
		pe.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, nrPagesField, protowire.VarintType), uint64(e.nr)))
		img.Entries = append(img.Entries, &crit.CriuEntry{Message: pe})
	}
	return func(f *os.File) error { return crit.New(nil, f, "", false, false).Encode(img) }
}

// stage writes what fill writes to a temporary file beside path.
func stage(path string, fill func(*os.File) error) (staging, error) {
	f, err := os.CreateTemp(filepath.Dir(path), ".delta-*")
	if err != nil {
		return staging{}, err
	}
	s := staging{tmp: f.Name(), path: path}
	err = fill(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(s.tmp, 0o644)
	}
	if err != nil {
		os.Remove(s.tmp)
		return staging{}, err
	}
	return s, nil
}

// writeFile writes path through a temporary file renamed into place.
func writeFile(path string, fill func(*os.File) error) error {
	s, err := stage(path, fill)
	if err == nil {
		if err = os.Rename(s.tmp, s.path); err != nil {
			os.Remove(s.tmp)
		}
	}
	return err
}

func pagemapFileName(pid int) string { return fmt.Sprintf("pagemap-%d.img", pid) }

func pagesPath(dir string, id uint32) string {
	return filepath.Join(dir, fmt.Sprintf("pages-%d.img", id))
}

// reader reads one process's pages out of an image and its chain.
type reader struct {
	pm     pagemapFile
	pages  *os.File
	parent *reader // nil: no parent, or it holds no such process
}

// openReader opens process pid of the image in dir with its chain; a
// process dir does not hold gives (nil, nil).
func openReader(dir string, pid int) (*reader, error) {
	pm, err := readPagemap(filepath.Join(dir, pagemapFileName(pid)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	r := &reader{pm: pm}
	if r.pages, err = os.Open(pagesPath(dir, pm.pagesID)); err != nil {
		return nil, err
	}
	if base, err := Base(dir); err != nil {
		r.close()
		return nil, err
	} else if base != "" {
		if r.parent, err = openReader(filepath.Join(dir, ParentLink), pid); err != nil {
			r.close()
			return nil, err
		}
	}
	return r, nil
}

func (r *reader) close() {
	for ; r != nil; r = r.parent {
		if r.pages != nil {
			r.pages.Close()
		}
	}
}

// page reads the page at vaddr into buf, through the chain, and returns
// the flags of the entry holding it; false when the image (with its
// chain) holds no page there.
func (r *reader) page(vaddr uint64, buf []byte) (bool, uint32, error) {
	for r != nil {
		es := r.pm.entries
		i := sort.Search(len(es), func(i int) bool { return es[i].end() > vaddr })
		if i == len(es) || es[i].vaddr > vaddr {
			return false, 0, nil
		}
		e := es[i]
		switch {
		case e.flags&flagParent != 0:
			r = r.parent
		case present(e.flags):
			n := e.off + int64(vaddr-e.vaddr)/pageSize
			if _, err := r.pages.ReadAt(buf, n*pageSize); err != nil {
				return false, 0, fmt.Errorf("read page %#x: %w", vaddr, err)
			}
			return true, e.flags, nil
		default: // neither here nor in the parent (not dumped)
			return false, 0, nil
		}
	}
	return false, 0, nil
}

// VMA status bits of CRIU's mm image (criu/include/image.h).
const (
	vmaRegular     = 1 << 0
	vmaVsyscall    = 1 << 2
	vmaVDSO        = 1 << 3
	vmaFilePrivate = 1 << 6
	vmaFileShared  = 1 << 7
	vmaAnonShared  = 1 << 8
	vmaAnonPrivate = 1 << 9
	vmaSysVIPC     = 1 << 10
	vmaSocket      = 1 << 11
	vmaVVAR        = 1 << 12
	vmaAIORing     = 1 << 13
	vmaMemfd       = 1 << 14
)

// span is an address range [start, end).
type span struct{ start, end uint64 }

// privateVMAs lists the areas of process pid whose pages may be left to a
// parent: regular private memory, anonymous or of a file. The vDSO, vvar
// and every special or shared area keep their pages in the image, as
// CRIU's restore treats them apart.
func privateVMAs(dir string, pid int) ([]span, error) {
	path := filepath.Join(dir, fmt.Sprintf("mm-%d.img", pid))
	img, err := decode(path, &mm.MmEntry{})
	if err != nil {
		return nil, err
	}
	if len(img.Entries) != 1 {
		return nil, fmt.Errorf("decode %s: %d entries", path, len(img.Entries))
	}
	m, ok := img.Entries[0].Message.(*mm.MmEntry)
	if !ok {
		return nil, fmt.Errorf("decode %s: entry of type %T", path, img.Entries[0].Message)
	}
	const special = vmaVsyscall | vmaVDSO | vmaFileShared | vmaAnonShared | vmaSysVIPC | vmaSocket | vmaVVAR | vmaAIORing | vmaMemfd
	var out []span
	for _, v := range m.GetVmas() {
		st := v.GetStatus()
		if st&vmaRegular == 0 || st&(vmaAnonPrivate|vmaFilePrivate) == 0 || st&special != 0 {
			continue
		}
		out = append(out, span{v.GetStart(), v.GetEnd()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out, nil
}

// within reports whether the page at va lies in one of spans (sorted).
func within(spans []span, va uint64) bool {
	i := sort.Search(len(spans), func(i int) bool { return spans[i].end > va })
	return i < len(spans) && spans[i].start <= va
}

// makeOne stages the rewrite of process pid of dir against the base.
func makeOne(dir, baseDir string, pid int, st *Stats) ([]staging, error) {
	pmPath := filepath.Join(dir, pagemapFileName(pid))
	pm, err := readPagemap(pmPath)
	if err != nil {
		return nil, err
	}
	src, err := os.Open(pagesPath(dir, pm.pagesID))
	if err != nil {
		return nil, err
	}
	defer src.Close()
	base, err := openReader(baseDir, pid)
	if err != nil {
		return nil, fmt.Errorf("base: %w", err)
	}
	if base == nil {
		return nil, nil // a process the base does not hold stays whole
	}
	if fi, err := src.Stat(); err == nil {
		st.Before += fi.Size()
	}
	defer base.close()
	private, err := privateVMAs(dir, pid)
	if err != nil {
		return nil, err
	}
	var out pagemapFile
	out.pagesID = pm.pagesID
	add := func(vaddr uint64, fl uint32, off int64) {
		if n := len(out.entries); n > 0 {
			last := &out.entries[n-1]
			if last.flags == fl && last.end() == vaddr {
				last.nr++
				return
			}
		}
		out.entries = append(out.entries, entry{vaddr: vaddr, nr: 1, flags: fl, off: off})
	}
	page, old := make([]byte, pageSize), make([]byte, pageSize)
	var kept int64
	pages, err := stage(pagesPath(dir, pm.pagesID), func(dst *os.File) error {
		for _, e := range pm.entries {
			if !present(e.flags) {
				out.entries = append(out.entries, e)
				continue
			}
			for i := int64(0); i < e.nr; i++ {
				va := e.vaddr + uint64(i*pageSize)
				if _, err := src.ReadAt(page, (e.off+i)*pageSize); err != nil {
					return fmt.Errorf("read page %#x: %w", va, err)
				}
				st.Pages++
				ok := false
				if within(private, va) {
					var err error
					if ok, _, err = base.page(va, old); err != nil {
						return fmt.Errorf("base: %w", err)
					}
				}
				if ok && bytes.Equal(page, old) {
					// Never lazy: CRIU's lazy-pages daemon does not
					// serve pages from a parent (a restore with such
					// entries hangs), so a lazy restore of a delta
					// copies these in eagerly.
					add(va, flagParent, -1)
					continue
				}
				if _, err := dst.Write(page); err != nil {
					return err
				}
				add(va, e.flags, kept)
				kept++
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	st.Kept += kept
	st.After += kept * pageSize
	m, err := stage(pmPath, encodePagemap(out))
	if err != nil {
		return []staging{pages}, err
	}
	return []staging{pages, m}, nil
}

// Flatten writes into out (a directory that must not exist) the image in
// dir as a whole one: every file as it is but the parent link, and every
// process's pages read through the chain.
func Flatten(dir, out string) error {
	if err := os.Mkdir(out, 0o700); err != nil {
		return fmt.Errorf("flatten image %s: %w", dir, err)
	}
	err := flatten(dir, out)
	if err != nil {
		os.RemoveAll(out)
		return fmt.Errorf("flatten image %s: %w", dir, err)
	}
	return nil
}

// FlatCopy returns a directory holding the image in dir whole: dir
// itself when it is whole, else a flattened copy beside it under a .tmp-
// name (the image cache removes such leftovers after a crash), which done
// removes.
func FlatCopy(dir string) (flat string, done func(), err error) {
	base, err := Base(dir)
	if err != nil || base == "" {
		return dir, func() {}, err
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), ".tmp-flat-"+filepath.Base(dir)+"-")
	if err == nil {
		err = os.Remove(tmp) // Flatten makes it
	}
	if err == nil {
		err = Flatten(dir, tmp)
	}
	if err != nil {
		return "", nil, err
	}
	return tmp, func() { os.RemoveAll(tmp) }, nil
}

func flatten(dir, out string) error {
	pids, err := pagemaps(dir)
	if err != nil {
		return err
	}
	pagesOf := map[string]bool{}
	for _, pid := range pids {
		r, err := openReader(dir, pid)
		if err != nil {
			return err
		}
		pagesOf[filepath.Base(pagesPath(dir, r.pm.pagesID))] = true
		err = flattenOne(r, out, pid)
		r.close()
		if err != nil {
			return fmt.Errorf("process %d: %w", pid, err)
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		if name == ParentLink || pagesOf[name] || pagemapName.MatchString(name) {
			continue
		}
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", name)
		}
		if err := copyFile(filepath.Join(dir, name), filepath.Join(out, name)); err != nil {
			return err
		}
	}
	return nil
}

func flattenOne(r *reader, out string, pid int) error {
	pm := pagemapFile{pagesID: r.pm.pagesID}
	page := make([]byte, pageSize)
	add := func(vaddr uint64, fl uint32) {
		if n := len(pm.entries); n > 0 && pm.entries[n-1].flags == fl && pm.entries[n-1].end() == vaddr {
			pm.entries[n-1].nr++
			return
		}
		pm.entries = append(pm.entries, entry{vaddr: vaddr, nr: 1, flags: fl, off: -1})
	}
	err := writeFile(pagesPath(out, pm.pagesID), func(dst *os.File) error {
		for _, e := range r.pm.entries {
			if !present(e.flags) && e.flags&flagParent == 0 {
				pm.entries = append(pm.entries, e)
				continue
			}
			// A page of the image's own keeps its flags; one of the
			// parent's becomes present and not lazy, as it was in
			// the delta (so a lazy restore whose daemon reads the
			// delta agrees with a restore of the flattened copy).
			fl := e.flags
			if e.flags&flagParent != 0 {
				fl = flagPresent
			}
			for i := int64(0); i < e.nr; i++ {
				va := e.vaddr + uint64(i*pageSize)
				ok, _, err := r.page(va, page)
				if err != nil {
					return err
				}
				if !ok {
					return fmt.Errorf("page %#x: in the parent, which does not hold it", va)
				}
				if _, err := dst.Write(page); err != nil {
					return err
				}
				add(va, fl)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return writeFile(filepath.Join(out, pagemapFileName(pid)), encodePagemap(pm))
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fi.Mode().Perm())
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

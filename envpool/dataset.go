package envpool

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"

	"github.com/arbor-env/arbor/state"
	"gopkg.in/yaml.v3"
)

// A Dataset is a family of task instances that share defaults: a
// directory with a dataset.yaml (name, defaults: any task fields) and an
// instances.jsonl, one instance per line (a JSON object of task fields,
// "name" or "id" required, overriding the defaults; maps such as env and
// hidden_files are merged key by key). It is loaded lazily: opening reads
// only each line's name and where the line is, so a dataset of thousands
// of instances opens in well under a second; an instance is read, merged
// and validated when it is first used (docs/tasks.md, "Datasets").
type Dataset struct {
	Name string
	dir  string
	defs taskFile
	file string
	refs []instanceRef
	// byName maps an instance's name to its index.
	byName map[string]int
	// Broken lists the lines that could not even be indexed (no name, a
	// duplicate, not JSON): reported by Open, never served.
	Broken []error

	mu sync.Mutex
	f  *os.File
}

type instanceRef struct {
	name string
	off  int64
	n    int
}

// instanceNameRE is an instance's name: its task is "DATASET/NAME".
var instanceNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// maxInstanceLine bounds one instance's JSON line.
const maxInstanceLine = 32 << 20

// OpenDataset indexes the dataset in dir. A line that cannot be indexed is
// listed in Broken, not an error: one bad instance never stops a server.
func OpenDataset(dir string) (*Dataset, error) {
	b, err := os.ReadFile(filepath.Join(dir, "dataset.yaml"))
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", dir, err)
	}
	var head struct {
		Name      string    `yaml:"name"`
		Instances string    `yaml:"instances"`
		Defaults  yaml.Node `yaml:"defaults"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&head); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: dataset %s: dataset.yaml: %v", ErrInvalidTask, dir, err)
	}
	d := &Dataset{Name: head.Name, dir: dir, byName: map[string]int{}}
	if d.Name == "" {
		d.Name = filepath.Base(dir)
	}
	if !taskNameRE.MatchString(d.Name) {
		return nil, fmt.Errorf("%w: dataset %s: name %q: want letters, digits, '.', '_' or '-'", ErrInvalidTask, dir, d.Name)
	}
	if head.Defaults.Kind != 0 {
		if err := decodeStrict(&head.Defaults, &d.defs); err != nil {
			return nil, fmt.Errorf("%w: dataset %s: defaults: %v", ErrInvalidTask, d.Name, err)
		}
	}
	if d.defs.Hidden != "" && !filepath.IsAbs(d.defs.Hidden) {
		d.defs.Hidden = filepath.Join(dir, d.defs.Hidden)
	}
	if head.Instances == "" {
		head.Instances = "instances.jsonl"
	}
	d.file = head.Instances
	if !filepath.IsAbs(d.file) {
		d.file = filepath.Join(dir, d.file)
	}
	f, err := os.Open(d.file)
	if err != nil {
		return nil, fmt.Errorf("dataset %s: %w", d.Name, err)
	}
	if err := d.index(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("dataset %s: %w", d.Name, err)
	}
	d.f = f
	return d, nil
}

// decodeStrict decodes a YAML node into a taskFile, refusing unknown
// keys.
func decodeStrict(n *yaml.Node, f *taskFile) error {
	b, err := yaml.Marshal(n)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(f)
}

// index records each line's name and place.
func (d *Dataset) index(f *os.File) error {
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	for line := 1; ; line++ {
		b, err := r.ReadSlice('\n')
		n := len(b)
		if errors.Is(err, bufio.ErrBufferFull) {
			// A long line: read the rest of it.
			rest, err2 := r.ReadBytes('\n')
			b = append(append([]byte(nil), b...), rest...)
			n, err = len(b), err2
		}
		if n > 0 {
			d.indexLine(line, bytes.TrimSpace(b), off, n)
		}
		off += int64(n)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (d *Dataset) indexLine(line int, b []byte, off int64, n int) {
	if len(b) == 0 || b[0] == '#' {
		return
	}
	bad := func(format string, a ...any) {
		d.Broken = append(d.Broken, fmt.Errorf("%w: dataset %s line %d: %s", ErrInvalidTask, d.Name, line, fmt.Sprintf(format, a...)))
	}
	if n > maxInstanceLine {
		bad("%d bytes, over the %d byte limit of an instance", n, maxInstanceLine)
		return
	}
	var id struct {
		Name string `json:"name"`
		ID   string `json:"id"`
	}
	if err := json.Unmarshal(b, &id); err != nil {
		bad("not a JSON object: %v", err)
		return
	}
	name := id.Name
	if name == "" {
		name = id.ID
	}
	if !instanceNameRE.MatchString(name) {
		bad("instance name %q: want 1-128 letters, digits, '.', '_' or '-'", name)
		return
	}
	if prev, dup := d.byName[name]; dup {
		bad("instance %q again (first at index %d)", name, prev)
		return
	}
	d.byName[name] = len(d.refs)
	d.refs = append(d.refs, instanceRef{name: name, off: off, n: n})
}

// Len is the number of instances indexed.
func (d *Dataset) Len() int { return len(d.refs) }

// Names returns the names of instances [from, from+n).
func (d *Dataset) Names(from, n int) []string {
	from = max(0, min(from, len(d.refs)))
	to := min(len(d.refs), from+max(0, n))
	names := make([]string, 0, to-from)
	for _, r := range d.refs[from:to] {
		names = append(names, r.name)
	}
	return names
}

// Index returns the index of the instance called name.
func (d *Dataset) Index(name string) (int, bool) {
	i, ok := d.byName[name]
	return i, ok
}

// Instance reads, merges and validates instance i: a task named
// "DATASET/NAME". A broken instance is an error naming it.
func (d *Dataset) Instance(i int) (Task, error) {
	if i < 0 || i >= len(d.refs) {
		return Task{}, fmt.Errorf("%w: dataset %s has %d instances, no index %d", state.ErrUnknownTask, d.Name, len(d.refs), i)
	}
	ref := d.refs[i]
	b := make([]byte, ref.n)
	d.mu.Lock()
	_, err := d.f.ReadAt(b, ref.off)
	d.mu.Unlock()
	if err != nil {
		return Task{}, fmt.Errorf("dataset %s: read instance %s: %w", d.Name, ref.name, err)
	}
	f := d.defs
	// Maps merge key by key (json fills an existing map): copy the
	// defaults' so that no instance writes into them.
	f.Env = cloneMap(d.defs.Env)
	f.HiddenFiles = cloneMap(d.defs.HiddenFiles)
	f.Hidden = ""
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return Task{}, fmt.Errorf("%w: %s/%s: %v", ErrInvalidTask, d.Name, ref.name, err)
	}
	t, err := f.task()
	if err != nil {
		return Task{}, fmt.Errorf("%w: %s/%s: %v", ErrInvalidTask, d.Name, ref.name, err)
	}
	t.Name = d.Name + "/" + ref.name
	switch {
	case t.Hidden != "" && !filepath.IsAbs(t.Hidden):
		t.Hidden = filepath.Join(d.dir, t.Hidden)
	case t.Hidden == "":
		t.Hidden = d.defs.Hidden
	}
	if err := t.Validate(); err != nil {
		return Task{}, err
	}
	return t, nil
}

// Close closes the instances file.
func (d *Dataset) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	err := d.f.Close()
	d.f = nil
	return err
}

func cloneMap[V any](m map[string]V) map[string]V {
	if m == nil {
		return nil
	}
	c := make(map[string]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// splitInstance splits "DATASET/NAME".
func splitInstance(name string) (dataset, instance string, ok bool) {
	return strings.Cut(name, "/")
}

// Catalog is what a task directory offers: its task files and its
// datasets (subdirectories with a dataset.yaml).
type Catalog struct {
	Tasks    []Task
	Datasets []*Dataset
}

// LoadDir loads the task files and datasets of dir. What is broken (a
// task file that does not load, a name used twice, a dataset that does
// not open, an instance line that cannot be indexed) is returned in
// problems, each naming its file, and left out: the rest is served. err
// is for a dir that cannot be read.
func LoadDir(dir string) (c Catalog, problems []error, err error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return c, nil, fmt.Errorf("read task dir: %w", err)
	}
	seen := map[string]string{}
	for _, ent := range ents {
		path := filepath.Join(dir, ent.Name())
		if ent.IsDir() {
			if _, err := os.Stat(filepath.Join(path, "dataset.yaml")); err != nil {
				continue // a task's hidden files, or anything else
			}
			d, err := OpenDataset(path)
			if err != nil {
				problems = append(problems, err)
				continue
			}
			if prev, ok := seen[d.Name]; ok {
				problems = append(problems, fmt.Errorf("%w: name %q used by both %s and %s", ErrInvalidTask, d.Name, prev, path))
				d.Close()
				continue
			}
			seen[d.Name] = path
			problems = append(problems, d.Broken...)
			c.Datasets = append(c.Datasets, d)
			continue
		}
		ext := strings.ToLower(filepath.Ext(ent.Name()))
		if ext != ".yaml" && ext != ".yml" && ext != ".json" {
			continue
		}
		t, err := LoadTask(path)
		if err != nil {
			problems = append(problems, err)
			continue
		}
		if prev, ok := seen[t.Name]; ok {
			problems = append(problems, fmt.Errorf("%w: name %q used by both %s and %s", ErrInvalidTask, t.Name, prev, path))
			continue
		}
		seen[t.Name] = path
		c.Tasks = append(c.Tasks, t)
	}
	return c, problems, nil
}

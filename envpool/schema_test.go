package envpool

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// TestTaskSchema: docs/task.schema.json names exactly the fields task
// files have (taskFile's), every shipped task file and every instance of
// a dataset under tasks/ validates against it, and a misspelt field fails
// it as it fails LoadTask.
func TestTaskSchema(t *testing.T) {
	raw, err := os.ReadFile("../docs/task.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	var inSchema []string
	for k := range doc["properties"].(map[string]any) {
		inSchema = append(inSchema, k)
	}
	var inCode []string
	ft := reflect.TypeFor[taskFile]()
	for i := range ft.NumField() {
		inCode = append(inCode, strings.Split(ft.Field(i).Tag.Get("json"), ",")[0])
	}
	slices.Sort(inSchema)
	slices.Sort(inCode)
	if !slices.Equal(inSchema, inCode) {
		t.Errorf("schema properties %v, task file fields %v", inSchema, inCode)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("task.json", doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("task.json")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("../tasks/*")
	checked := 0
	for _, f := range files {
		v, ok := readAny(t, f)
		if !ok {
			continue
		}
		if err := sch.Validate(v); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		checked++
	}
	dsets, _ := filepath.Glob("../tasks/*/instances.jsonl")
	for _, f := range dsets {
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(nil, maxInstanceLine)
		for sc.Scan() {
			var v any
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			if err := sch.Validate(v); err != nil {
				t.Errorf("%s: %v", f, err)
			}
			checked++
		}
		fh.Close()
	}
	if checked < 3 {
		t.Fatalf("checked %d task files, want the shipped ones", checked)
	}
	bad := map[string]any{"name": "x", "image": "busybox", "verifierr": "true"}
	if err := sch.Validate(bad); err == nil {
		t.Error("a misspelt field passed the schema")
	}
	path := filepath.Join(t.TempDir(), "x.yaml")
	os.WriteFile(path, []byte("image: busybox\nverifierr: 'true'\n"), 0o644)
	if _, err := LoadTask(path); err == nil {
		t.Error("a misspelt field passed LoadTask")
	}
}

// readAny reads a task file as JSON values (YAML through yaml.v3).
func readAny(t *testing.T, f string) (any, bool) {
	ext := strings.ToLower(filepath.Ext(f))
	if ext != ".yaml" && ext != ".yml" && ext != ".json" {
		return nil, false
	}
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if ext == ".json" {
		err = json.Unmarshal(b, &v)
	} else {
		err = yaml.Unmarshal(b, &v)
		if err == nil {
			// Through JSON: the validator wants JSON's types.
			var j []byte
			if j, err = json.Marshal(v); err == nil {
				err = json.Unmarshal(j, &v)
			}
		}
	}
	if err != nil {
		t.Fatalf("%s: %v", f, err)
	}
	return v, true
}

package e2b_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/arbor-env/arbor/server/e2b"
)

// TestDescriptors holds the API's own definitions of envd's messages
// (messages.go) to the Protobuf descriptors the pinned SDK embeds (its
// generated process and filesystem code): every JSON field the API reads
// or writes is a field of that message under its JSON name, of a
// matching type, and every call of the two services has a route
// (served, or answered unimplemented).
func TestDescriptors(t *testing.T) {
	dir := npmInstall(t)
	src, err := os.ReadFile(filepath.Join(dir, "node_modules", "e2b", "dist", "index.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := map[string]*descriptorpb.DescriptorProto{}
	var methods []string
	var add func(prefix string, m *descriptorpb.DescriptorProto)
	add = func(prefix string, m *descriptorpb.DescriptorProto) {
		name := prefix + "." + m.GetName()
		msgs[name] = m
		for _, n := range m.GetNestedType() {
			add(name, n)
		}
	}
	for _, b64 := range regexp.MustCompile(`fileDesc\("([A-Za-z0-9+/=]+)"`).FindAllStringSubmatch(string(src), -1) {
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(b64[1], "="))
		if err != nil {
			t.Fatal(err)
		}
		var fd descriptorpb.FileDescriptorProto
		if err := proto.Unmarshal(raw, &fd); err != nil {
			t.Fatal(err)
		}
		if fd.GetPackage() != "process" && fd.GetPackage() != "filesystem" {
			continue
		}
		for _, m := range fd.GetMessageType() {
			add(fd.GetPackage(), m)
		}
		for _, s := range fd.GetService() {
			for _, m := range s.GetMethod() {
				methods = append(methods, "/"+fd.GetPackage()+"."+s.GetName()+"/"+m.GetName())
			}
		}
	}
	if len(methods) == 0 {
		t.Fatal("no process or filesystem descriptors in the SDK")
	}
	for name, v := range e2b.Messages {
		t.Run(name, func(t *testing.T) {
			m, ok := msgs[name]
			if !ok {
				t.Fatalf("the SDK has no message %s", name)
			}
			fields := map[string]*descriptorpb.FieldDescriptorProto{}
			for _, f := range m.GetField() {
				fields[jsonName(f.GetName())] = f
			}
			rt := reflect.TypeOf(v)
			for i := range rt.NumField() {
				sf := rt.Field(i)
				tag, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
				f, ok := fields[tag]
				if !ok {
					t.Errorf("field %s (json %q): not a field of %s", sf.Name, tag, name)
					continue
				}
				if !compatible(sf.Type, f) {
					t.Errorf("field %s: Go %s for a %s %s", sf.Name, sf.Type, f.GetLabel(), f.GetType())
				}
			}
		})
	}
	// A route for every call of the SDK's services.
	api := e2b.New(e2b.Options{})
	routes := api.RPCRoutes()
	for _, m := range methods {
		svc := m[:strings.LastIndex(m, "/")+1]
		if !slices.Contains(routes, m) && !slices.Contains(routes, svc) {
			t.Errorf("no route for %s", m)
		}
	}
}

// jsonName is the proto3 JSON name of a field (lowerCamelCase).
func jsonName(s string) string {
	var b strings.Builder
	up := false
	for _, c := range s {
		if c == '_' {
			up = true
			continue
		}
		if up {
			b.WriteString(strings.ToUpper(string(c)))
			up = false
		} else {
			b.WriteRune(c)
		}
	}
	return b.String()
}

// compatible reports whether Go type gt carries field f in proto3 JSON.
func compatible(gt reflect.Type, f *descriptorpb.FieldDescriptorProto) bool {
	if gt.Kind() == reflect.Pointer {
		gt = gt.Elem()
	}
	switch f.GetType() {
	case descriptorpb.FieldDescriptorProto_TYPE_STRING:
		if f.GetLabel() == descriptorpb.FieldDescriptorProto_LABEL_REPEATED {
			return gt.Kind() == reflect.Slice && gt.Elem().Kind() == reflect.String
		}
		return gt.Kind() == reflect.String
	case descriptorpb.FieldDescriptorProto_TYPE_ENUM:
		return gt.Kind() == reflect.String || gt.Kind() == reflect.Int32
	case descriptorpb.FieldDescriptorProto_TYPE_BOOL:
		return gt.Kind() == reflect.Bool
	case descriptorpb.FieldDescriptorProto_TYPE_BYTES:
		return gt.Kind() == reflect.Slice && gt.Elem().Kind() == reflect.Uint8
	case descriptorpb.FieldDescriptorProto_TYPE_UINT32:
		return gt.Kind() == reflect.Uint32
	case descriptorpb.FieldDescriptorProto_TYPE_SINT32, descriptorpb.FieldDescriptorProto_TYPE_INT32:
		return gt.Kind() == reflect.Int32
	case descriptorpb.FieldDescriptorProto_TYPE_INT64:
		// A string in proto3 JSON: the API's int64s writes one.
		return gt.Kind() == reflect.Int64 && gt.Name() == "int64s"
	case descriptorpb.FieldDescriptorProto_TYPE_MESSAGE:
		switch {
		case f.GetTypeName() == ".google.protobuf.Timestamp":
			return gt == reflect.TypeOf(time.Time{})
		case strings.HasSuffix(f.GetTypeName(), "Entry"): // a map
			return gt.Kind() == reflect.Map
		case f.GetLabel() == descriptorpb.FieldDescriptorProto_LABEL_REPEATED:
			return gt.Kind() == reflect.Slice && gt.Elem().Kind() == reflect.Struct
		}
		// A message, or the PTY the API takes raw to refuse it.
		return gt.Kind() == reflect.Struct || gt == reflect.TypeOf([]byte(nil)) || gt.Name() == "RawMessage"
	}
	return false
}

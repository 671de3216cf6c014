package state

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOneKind keeps the checkpoint kind defined once, here: no other file
// of the module declares a kind type (type Kind string), aliases one
// (type Kind = state.Kind), or names the kinds again as typed constants
// ("none", "fs", "proc", "full" typed as a Kind, or re-exports of
// state.None and the others).
func TestOneKind(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	self := filepath.Join(root, "state")
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (path == self || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") ||
				name == "vendor" || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		for _, msg := range kindDecls(f) {
			rel, _ := filepath.Rel(root, path)
			t.Errorf("%s: %s: the checkpoint kind is state.Kind", rel, msg)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("walked %d Go files from %s: not the module's root?", files, root)
	}
}

// kindDecls returns the declarations of f that define a checkpoint kind
// again.
func kindDecls(f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range gd.Specs {
			switch s := spec.(type) {
			case *ast.TypeSpec:
				if s.Assign != 0 && isKindType(s.Type) {
					out = append(out, "type "+s.Name.Name+" aliases a kind")
				} else if id, ok := s.Type.(*ast.Ident); ok && id.Name == "string" && s.Name.Name == "Kind" {
					out = append(out, "type Kind string")
				}
			case *ast.ValueSpec:
				if gd.Tok != token.CONST {
					continue
				}
				for i, name := range s.Names {
					if i >= len(s.Values) {
						break
					}
					if v := kindValue(s.Values[i]); v != "" && (s.Type == nil || isKindType(s.Type)) &&
						(s.Type != nil || !isLiteral(s.Values[i])) {
						out = append(out, "const "+name.Name+" = "+v)
					}
				}
			}
		}
	}
	return out
}

// isKindType reports whether e names a type Kind (Kind, state.Kind,
// manifest.Kind...).
func isKindType(e ast.Expr) bool {
	switch t := e.(type) {
	case *ast.Ident:
		return t.Name == "Kind"
	case *ast.SelectorExpr:
		return t.Sel.Name == "Kind"
	}
	return false
}

func isLiteral(e ast.Expr) bool {
	_, ok := e.(*ast.BasicLit)
	return ok
}

// kindValue returns the kind e spells, as a string literal of one of the
// four kinds or a constant of another package named like one, or "".
func kindValue(e ast.Expr) string {
	switch v := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(v.Value); err == nil {
			switch s {
			case string(None), string(FS), string(Proc), string(Full):
				return v.Value
			}
		}
	case *ast.SelectorExpr:
		switch strings.TrimPrefix(v.Sel.Name, "Kind") {
		case "None", "FS", "Proc", "Full":
			if x, ok := v.X.(*ast.Ident); ok {
				return x.Name + "." + v.Sel.Name
			}
		}
	case *ast.CallExpr: // Kind("fs")
		if len(v.Args) == 1 && isKindType(v.Fun) {
			return kindValue(v.Args[0])
		}
	}
	return ""
}

package image

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// errNoAptSource is wrapped when the host's apt configuration names no
// source for the suite and component a build needs.
var errNoAptSource = errors.New("no matching apt source")

// aptSource is one source entry of apt's configuration, in either format.
type aptSource struct {
	Types      []string
	URIs       []string
	Suites     []string
	Components []string
	SignedBy   string
}

// parseDeb822Sources parses a deb822 ".sources" file: paragraphs of
// "Field: value" lines separated by blank lines, with "#" comments and
// indented continuation lines.
func parseDeb822Sources(content string) []aptSource {
	var out []aptSource
	fields := map[string]string{}
	last := ""
	flush := func() {
		if len(fields) > 0 && !strings.EqualFold(fields["enabled"], "no") {
			out = append(out, aptSource{
				Types:      strings.Fields(fields["types"]),
				URIs:       strings.Fields(fields["uris"]),
				Suites:     strings.Fields(fields["suites"]),
				Components: strings.Fields(fields["components"]),
				SignedBy:   strings.TrimSpace(fields["signed-by"]),
			})
		}
		fields, last = map[string]string{}, ""
	}
	for _, line := range strings.Split(content, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		if strings.TrimSpace(line) == "" {
			flush()
			continue
		}
		if (line[0] == ' ' || line[0] == '\t') && last != "" {
			fields[last] += " " + strings.TrimSpace(line)
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		last = strings.ToLower(strings.TrimSpace(k))
		fields[last] = strings.TrimSpace(v)
	}
	flush()
	return out
}

// parseOneLineSources parses the classic "deb [options] uri suite
// component..." format of sources.list.
func parseOneLineSources(content string) []aptSource {
	var out []aptSource
	for _, line := range strings.Split(content, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		src := aptSource{Types: []string{f[0]}}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") {
			end := slices.IndexFunc(f, func(s string) bool { return strings.HasSuffix(s, "]") })
			if end < 0 {
				continue
			}
			for _, o := range f[:end+1] {
				o = strings.Trim(o, "[]")
				if k, v, ok := strings.Cut(o, "="); ok && k == "signed-by" {
					src.SignedBy = v
				}
			}
			f = f[end+1:]
		}
		if len(f) < 2 {
			continue
		}
		src.URIs, src.Suites, src.Components = f[:1], f[1:2], f[2:]
		out = append(out, src)
	}
	return out
}

// findAptSource returns the first binary ("deb") source that serves suite
// and component.
func findAptSource(sources []aptSource, suite, component string) (uri, signedBy string, ok bool) {
	for _, s := range sources {
		if slices.Contains(s.Types, "deb") && slices.Contains(s.Suites, suite) &&
			slices.Contains(s.Components, component) && len(s.URIs) > 0 {
			return s.URIs[0], s.SignedBy, true
		}
	}
	return "", "", false
}

// hostAptSource reads the machine's apt configuration under etcApt (usually
// /etc/apt) and returns the URI and keyring of its source for suite/component.
func hostAptSource(etcApt, suite, component string) (uri, signedBy string, err error) {
	var sources []aptSource
	var read []string
	if b, err := os.ReadFile(filepath.Join(etcApt, "sources.list")); err == nil {
		sources = append(sources, parseOneLineSources(string(b))...)
		read = append(read, "sources.list")
	}
	for _, pat := range []string{"*.list", "*.sources"} {
		files, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", pat))
		sort.Strings(files)
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			read = append(read, filepath.Base(f))
			if strings.HasSuffix(f, ".sources") {
				sources = append(sources, parseDeb822Sources(string(b))...)
			} else {
				sources = append(sources, parseOneLineSources(string(b))...)
			}
		}
	}
	uri, signedBy, ok := findAptSource(sources, suite, component)
	if !ok {
		return "", "", fmt.Errorf("%w: %s %s in %s (read: %s)", errNoAptSource, suite, component, etcApt, strings.Join(read, ", "))
	}
	return uri, signedBy, nil
}

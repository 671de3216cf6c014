// Package fusecompat lets go-zfs v3 drive Debian's zfs-fuse (pool version
// 23). go-zfs lists datasets with `zfs list -Hp -o name,origin,used,...,
// written,logicalused,usedbydataset`; zfs-fuse's `zfs list` has no -p and
// knows neither written nor logicalused. Main stands in for the zfs command:
// such a `list` is answered from `zfs list -H -o name` (same -r, -d, -t and
// filters, so the same datasets in the same order) plus one
// `zfs get -Hp` for the properties zfs-fuse has (exact byte counts), and
// "-" for the others, which go-zfs reads as 0. Every other invocation is
// passed to the real zfs unchanged. See docs/zfs.md.
package fusecompat

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// Missing are the properties zfs-fuse lacks; they are reported as "-".
var Missing = map[string]bool{"written": true, "logicalused": true, "logicalreferenced": true}

// Main runs one zfs command line (args without the program name) against
// the real zfs binary at real and returns the exit code.
func Main(args []string, real string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "list" {
		if req, ok := parseList(args[1:]); ok && req.parsable {
			if err := req.run(real, stdout, stderr); err != nil {
				fmt.Fprintln(stderr, err)
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					return ee.ExitCode()
				}
				return 1
			}
			return 0
		}
	}
	cmd := exec.Command(real, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		fmt.Fprintln(stderr, err)
		return 127
	}
	return 0
}

// listReq is a parsed `zfs list` command line.
type listReq struct {
	parsable bool
	scripted bool
	passArgs []string // -r, -d N, -t T, -s/-S P, passed on to the name listing
	props    []string
	filters  []string
}

func parseList(args []string) (listReq, bool) {
	var r listReq
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" {
			r.filters = append(r.filters, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			switch c := a[j]; c {
			case 'p':
				r.parsable = true
			case 'H':
				r.scripted = true
			case 'r':
				r.passArgs = append(r.passArgs, "-r")
			case 'o', 'd', 't', 's', 'S':
				// The value is the rest of this argument or the next one.
				val := a[j+1:]
				if val == "" {
					if i+1 == len(args) {
						return r, false
					}
					i++
					val = args[i]
				}
				if c == 'o' {
					r.props = strings.Split(val, ",")
				} else {
					r.passArgs = append(r.passArgs, "-"+string(c), val)
				}
				j = len(a)
			default:
				return r, false
			}
		}
	}
	if len(r.props) == 0 {
		r.props = []string{"name", "used", "available", "referenced", "mountpoint"}
	}
	return r, true
}

// run answers the listing. A dataset destroyed between the name listing
// and the get (another process's destroy) fails the get with "does not
// exist"; the listing is then taken again, up to five times, as a real
// `zfs list`, which skips what vanishes while it runs, would not fail.
func (r listReq) run(real string, stdout, stderr io.Writer) error {
	for try := 1; ; try++ {
		var getErr bytes.Buffer
		err := r.runOnce(real, stdout, stderr, &getErr)
		if err == nil || try == 5 || !strings.Contains(getErr.String(), "does not exist") {
			stderr.Write(getErr.Bytes())
			return err
		}
	}
}

func (r listReq) runOnce(real string, stdout, stderr, getStderr io.Writer) error {
	var out bytes.Buffer
	list := exec.Command(real, append(append(append([]string{"list", "-H"}, r.passArgs...), "-o", "name"), r.filters...)...)
	list.Stdout, list.Stderr = &out, stderr
	if err := list.Run(); err != nil {
		return err
	}
	names := strings.FieldsFunc(out.String(), func(r rune) bool { return r == '\n' })
	if len(names) == 0 {
		return nil
	}
	var get []string
	for _, p := range r.props {
		if p != "name" && !Missing[p] {
			get = append(get, p)
		}
	}
	values := map[string]map[string]string{}
	if len(get) > 0 {
		out.Reset()
		cmd := exec.Command(real, append([]string{"get", "-Hp", "-o", "name,property,value", strings.Join(get, ",")}, names...)...)
		cmd.Stdout, cmd.Stderr = &out, getStderr
		if err := cmd.Run(); err != nil {
			return err
		}
		for line := range strings.SplitSeq(strings.TrimSuffix(out.String(), "\n"), "\n") {
			f := strings.SplitN(line, "\t", 3)
			if len(f) != 3 {
				continue
			}
			if values[f[0]] == nil {
				values[f[0]] = map[string]string{}
			}
			values[f[0]][f[1]] = f[2]
		}
	}
	sep := "\t"
	if !r.scripted {
		sep = "  "
	}
	for _, n := range names {
		row := make([]string, len(r.props))
		for i, p := range r.props {
			switch v, ok := values[n][p]; {
			case p == "name":
				row[i] = n
			case ok && v != "":
				row[i] = v
			default:
				row[i] = "-"
			}
		}
		if _, err := fmt.Fprintln(stdout, strings.Join(row, sep)); err != nil {
			return err
		}
	}
	return nil
}

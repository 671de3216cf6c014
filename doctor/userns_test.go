package doctor

import (
	"context"
	"strings"
	"testing"
)

func TestCheckUserNS(t *testing.T) {
	const first, size = 1 << 30, 65536
	probe := "unshare --user --map-root-user true"
	tests := []struct {
		name   string
		files  map[string]string
		runs   bool
		want   Status
		detail string
	}{
		{"free range", map[string]string{"/etc/passwd": "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n", "/etc/subuid": "alice:100000:65536\n"}, true, OK, "host 1073741824-1073807359"},
		{"no user namespaces", nil, false, Warn, "cannot make a user namespace"},
		{"disabled by sysctl", map[string]string{"/proc/sys/user/max_user_namespaces": "0\n"}, true, Warn, "max_user_namespaces is 0"},
		{"sub-uid range overlaps", map[string]string{"/etc/subuid": "alice:1073700000:65536\n"}, true, Warn, "alice's sub-uids"},
		{"a user inside the range", map[string]string{"/etc/passwd": "svc:x:1073741900:10::/:/bin/false\n"}, true, Warn, "svc's uid"},
		{"a sub-gid range after it", map[string]string{"/etc/subgid": "bob:1073807360:65536\n"}, true, OK, "no host user"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := healthy()
			for k, v := range tt.files {
				h.files[k] = v
			}
			if tt.runs {
				h.runs[probe] = ""
			}
			c := CheckUserNS(context.Background(), h, first, size)
			if c.Status != tt.want || !strings.Contains(c.Detail, tt.detail) || c.Required {
				t.Errorf("got %+v, want status %s (optional) with %q", c, tt.want, tt.detail)
			}
		})
	}
}

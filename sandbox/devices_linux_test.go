package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestDeviceFilter: the eBPF allow-list alone (a v2 cgroup with no v1
// devices controller, as on a pure v2 host) lets a process in the group
// make the sandbox's nodes and refuses any other.
func TestDeviceFilter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: cgroups and mknod")
	}
	v2root, _ := unifiedRoot()
	dir := filepath.Join(v2root, "arbor", fmt.Sprintf("devtest-%d", os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	defer unix.Rmdir(dir)
	if err := attachDeviceFilter(dir); err != nil {
		t.Fatal(err)
	}
	cgfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(cgfd)
	tmp := t.TempDir()
	tests := []struct {
		name, kind   string
		major, minor int
		allowed      bool
	}{
		{"null", "c", 1, 3, true},
		{"urandom", "c", 1, 9, true},
		{"ptmx", "c", 5, 2, true},
		{"a pts", "c", 136, 7, true},
		{"mem", "c", 1, 1, false},
		{"kmsg", "c", 1, 11, false},
		{"console", "c", 5, 1, false},
		{"a tty", "c", 4, 1, false},
		{"loop0", "b", 7, 0, false},
		{"a block device with an allowed char number", "b", 1, 3, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := filepath.Join(tmp, fmt.Sprint(i))
			cmd := exec.Command("mknod", node, tt.kind, fmt.Sprint(tt.major), fmt.Sprint(tt.minor))
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
			out, err := cmd.CombinedOutput()
			if (err == nil) != tt.allowed {
				t.Fatalf("mknod %s %d:%d in the group: err %v (%s), want allowed=%v", tt.kind, tt.major, tt.minor, err, out, tt.allowed)
			}
			if tt.allowed {
				// and it opens: write to the made null node
				if tt.major == 1 && tt.minor == 3 {
					sh := exec.Command("sh", "-c", "echo x > "+node)
					sh.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: cgfd}
					if out, err := sh.CombinedOutput(); err != nil {
						t.Fatalf("write to %s: %v %s", node, err, out)
					}
				}
			}
		})
	}
	// Outside the group the same node is fine: the filter is the group's.
	if out, err := exec.Command("mknod", filepath.Join(tmp, "mem-outside"), "c", "1", "1").CombinedOutput(); err != nil {
		t.Fatalf("mknod outside the group: %v %s", err, out)
	}
}

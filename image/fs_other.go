//go:build !linux

package image

import (
	"errors"
	"io/fs"
	"os/exec"
	"path/filepath"
)

func unmountUnder(string) error { return nil }

func diskUsage(root string) (int64, error) {
	var total int64
	err := filepath.WalkDir(root, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		total += fi.Size()
		return nil
	})
	return total, errors.Join(err)
}

func killGroupOnCancel(*exec.Cmd) {}

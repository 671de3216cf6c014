package imgdelta

import "fmt"

// Pages reads every dumped page of every process of the image in dir,
// through its chain, keyed by "pid:address".
func Pages(dir string) (map[string][]byte, error) {
	pids, err := pagemaps(dir)
	if err != nil {
		return nil, err
	}
	m := map[string][]byte{}
	for _, pid := range pids {
		r, err := openReader(dir, pid)
		if err != nil {
			return nil, err
		}
		for _, e := range r.pm.entries {
			if !present(e.flags) && e.flags&flagParent == 0 {
				continue
			}
			for i := int64(0); i < e.nr; i++ {
				va := e.vaddr + uint64(i*pageSize)
				buf := make([]byte, pageSize)
				ok, _, err := r.page(va, buf)
				if err != nil || !ok {
					r.close()
					return nil, fmt.Errorf("process %d page %#x: held %v, %v", pid, va, ok, err)
				}
				m[fmt.Sprintf("%d:%#x", pid, va)] = buf
			}
		}
		r.close()
	}
	return m, nil
}

package criu

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/arbor-env/arbor/cr"
)

// TestSparesConcurrentStartsAllExit takes and closes CRIUs from many
// goroutines at once, as parallel branch children do. Every close must
// return: a CRIU that inherited another's swrk socket end never exits, and
// its waiter (once the refill goroutine, holding the spares' lock) hung
// every later dump and restore of the server.
func TestSparesConcurrentStartsAllExit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: restore spares make network namespaces")
	}
	c, err := New("", nil)
	if errors.Is(err, cr.ErrUnavailable) {
		t.Skipf("criu 4.x not installed: run make deps (%v)", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		for g := 0; g < 12; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 4; i++ {
					s, err := c.take((g+i)%2 == 0)
					if err != nil {
						t.Error(err)
						return
					}
					s.close()
				}
			}()
		}
		wg.Wait()
		c.Close()
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("a CRIU did not exit after its socket was closed: closing spares hangs")
	}
}

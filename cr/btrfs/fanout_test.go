package btrfs

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkCloneFanOut makes 32 clones of one snapshot (a branch(32)'s
// roots), one at a time, two at a time and all at once: why the engine
// clones a branch's roots ahead one after another (docs/engine.md, "Roots
// cloned ahead").
func BenchmarkCloneFanOut(b *testing.B) {
	s := newPool(b)
	ctx := context.Background()
	if err := s.CreateVolume(ctx, "vol"); err != nil {
		b.Fatal(err)
	}
	imageTree(b, s.Path("vol"))
	if err := s.Snapshot(ctx, "vol", "image"); err != nil {
		b.Fatal(err)
	}
	round := 0
	for _, at := range []int{1, 2, 32} {
		b.Run(fmt.Sprintf("n=32/at-once=%d", at), func(b *testing.B) {
			for b.Loop() {
				round++
				sem := make(chan struct{}, at)
				var wg sync.WaitGroup
				for i := range 32 {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						if err := s.Clone(ctx, "image", fmt.Sprintf("c%d/%d", round, i)); err != nil {
							b.Error(err)
						}
					}()
				}
				wg.Wait()
			}
		})
	}
}

package image

import (
	"context"
	"testing"
)

// TestPruneLayersLeavesHeldLayers: a layer an unpack in this process
// holds (its image not made yet) survives a prune; once released, a
// layer no image uses goes.
func TestPruneLayersLeavesHeldLayers(t *testing.T) {
	s, snap := newTestStore(t)
	ctx := context.Background()
	chain := "sha256:" + "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12"
	if err := snap.CreateVolume(ctx, "tmp"); err != nil {
		t.Fatal(err)
	}
	if err := snap.Snapshot(ctx, "tmp", LayerSnapshot(chain)); err != nil {
		t.Fatal(err)
	}
	var held []string
	s.holdLayer(chain, &held)
	if n, err := s.PruneLayers(ctx); err != nil || n != 0 {
		t.Fatalf("prune with the layer held: %d, %v; want 0", n, err)
	}
	s.releaseLayers(held)
	if n, err := s.PruneLayers(ctx); err != nil || n != 1 {
		t.Fatalf("prune after the release: %d, %v; want 1", n, err)
	}
	if s.hasSnapshot(ctx, LayerSnapshot(chain)) {
		t.Error("the released layer is still there")
	}
}

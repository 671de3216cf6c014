package server

import "testing"

// TestOutboxBudget: room closes when the bytes held reach the budget and
// opens when the writer takes them under it; the crossing callback sees
// both, in order; close releases everything for good.
func TestOutboxBudget(t *testing.T) {
	var crossings []bool
	var gauge int64
	o := newOutbox(10, func(d int64) { gauge += d }, func(over bool) { crossings = append(crossings, over) })
	o.put(make([]byte, 6))
	if o.full() != nil {
		t.Fatal("6 of 10 bytes held: no room")
	}
	o.put(make([]byte, 6))
	room := o.full()
	if room == nil {
		t.Fatal("12 of 10 bytes held: room")
	}
	b := o.take()
	if len(b) != 6 {
		t.Fatalf("take: %d bytes", len(b))
	}
	if o.full() == nil {
		t.Error("a frame taken but not written yet still counts")
	}
	o.wrote(len(b))
	select {
	case <-room:
	default:
		t.Error("6 of 10 bytes held: room still closed")
	}
	if held, peak := o.stats(); held != 6 || peak != 12 || gauge != 6 {
		t.Errorf("held %d, peak %d, gauge %d: want 6, 12, 6", held, peak, gauge)
	}
	o.put(make([]byte, 6))
	o.close()
	o.put(make([]byte, 6))
	if held, _ := o.stats(); held != 0 || gauge != 0 || o.full() != nil || o.take() != nil {
		t.Errorf("after close: held %d, gauge %d, want nothing held and room", held, gauge)
	}
	if want := []bool{true, false, true, false}; len(crossings) != len(want) {
		t.Errorf("crossings %v, want %v", crossings, want)
	} else {
		for i := range want {
			if crossings[i] != want[i] {
				t.Errorf("crossings %v, want %v", crossings, want)
				break
			}
		}
	}
}

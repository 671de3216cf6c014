package coordinator

import (
	"reflect"
	"testing"
)

// TestHealthAdd: a cluster's health sums every figure of its nodes' (a
// field added to Health and forgotten in Add fails here), and lists each
// node's file systems under its name.
func TestHealthAdd(t *testing.T) {
	one := Health{Checkpoints: map[string]float64{"full": 1}, Verified: map[string]float64{"ok": 1},
		Disk:      []DiskHealth{{Name: "pool", Used: 1, Total: 2}},
		Admission: []Admission{{Class: ClassStep, Slots: 4, Running: 1, Queued: 3, WaitS: 0.5, ServedS: 1, Busy: 2}}}
	v := reflect.ValueOf(&one).Elem()
	for i := 0; i < v.NumField(); i++ {
		switch f := v.Field(i); f.Kind() {
		case reflect.Int, reflect.Int64:
			f.SetInt(1)
		case reflect.Uint64:
			f.SetUint(1)
		case reflect.Float64:
			f.SetFloat(1)
		case reflect.Map, reflect.Slice:
		default:
			t.Fatalf("Health.%s: kind %s not covered by this test", v.Type().Field(i).Name, f.Kind())
		}
	}
	var sum Health
	sum.Add("a", one)
	sum.Add("b", one)
	s := reflect.ValueOf(sum)
	for i := 0; i < s.NumField(); i++ {
		name := s.Type().Field(i).Name
		switch f := s.Field(i); f.Kind() {
		case reflect.Int, reflect.Int64:
			if f.Int() != 2 {
				t.Errorf("%s = %d, want 2", name, f.Int())
			}
		case reflect.Uint64:
			if f.Uint() != 2 {
				t.Errorf("%s = %d, want 2", name, f.Uint())
			}
		case reflect.Float64:
			if f.Float() != 2 {
				t.Errorf("%s = %v, want 2", name, f.Float())
			}
		}
	}
	if sum.Checkpoints["full"] != 2 || sum.Verified["ok"] != 2 {
		t.Errorf("maps: %v %v, want 2 each", sum.Checkpoints, sum.Verified)
	}
	want := []DiskHealth{{Name: "a/pool", Used: 1, Total: 2}, {Name: "b/pool", Used: 1, Total: 2}}
	if !reflect.DeepEqual(sum.Disk, want) {
		t.Errorf("disks %+v, want %+v", sum.Disk, want)
	}
	wantAdmit := []Admission{{Class: ClassStep, Slots: 8, Running: 2, Queued: 6, WaitS: 0.5, ServedS: 1, Busy: 4}}
	if !reflect.DeepEqual(sum.Admission, wantAdmit) {
		t.Errorf("admission %+v, want %+v (queues summed by class, the slowest wait)", sum.Admission, wantAdmit)
	}
}

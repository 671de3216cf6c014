package manifest

import (
	"encoding/json"
	"fmt"
)

// record is what the buckets hold: a JSON value keyed by its own id.
type record interface {
	Artifact | State | Env
	recordID() string
}

func encode[T record](v T) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", v.recordID(), err)
	}
	return b, nil
}

// decode parses a stored value and checks that it names the key it is
// stored under, so a damaged or misplaced record is caught, not trusted.
func decode[T record](key, val []byte) (T, error) {
	var v T
	if err := json.Unmarshal(val, &v); err != nil {
		return v, fmt.Errorf("decode record %q: %w: %v", key, ErrCorrupt, err)
	}
	if v.recordID() != string(key) {
		return v, fmt.Errorf("decode record %q: id %q: %w", key, v.recordID(), ErrCorrupt)
	}
	return v, nil
}

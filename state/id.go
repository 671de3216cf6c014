package state

import (
	"crypto/rand"
	"encoding/hex"
)

// NewID returns prefix followed by 48 random bits in hex: the ids of
// envs ("" prefix), states ("s"), artifacts and sandboxes.
func NewID(prefix string) string {
	var b [6]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

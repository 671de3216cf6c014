package doctor

import "unsafe"

// uintptrOf is the address of a mapping's first byte, for pagemap.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

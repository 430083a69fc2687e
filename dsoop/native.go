package dsoop

/*
#include "dsoop.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/tvmdsoop/tvmdsoop/internal/native"
)

// What C holders in this module reach through internal/native, and no one else.
func init() {
	native.RetainFunc = retainFunc
	native.RetainVMFunc = retainVMFunc
	native.KeepLoaded = keepLoaded
}

func retainFunc(fn any, dst unsafe.Pointer) error {
	f, err := as[*Func](fn, "RetainFunc")
	if err != nil {
		return err
	}
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	C.dsoop_function_retain(&f.ref.fn, (*C.DsoopFunction)(dst))
	return nil
}

func retainVMFunc(fn any) (pool unsafe.Pointer, index int32, err error) {
	f, err := as[*VMFunc](fn, "RetainVMFunc")
	if err != nil {
		return nil, 0, err
	}
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return nil, 0, fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	poolsMu.Lock()
	f.ref.pool.refs++
	poolsMu.Unlock()
	return unsafe.Pointer(f.ref.pool.ptr), int32(f.ref.index), nil
}

// keptEntries are the libraries keepLoaded holds, for the life of the process.
// An entry is referenced here and not only from the modules map, which drops it
// when a rebuilt file at its path replaces it: unreferenced, its TVM module would
// be lost to the process (LeakSanitizer reports it) rather than kept.
var keptEntries []*moduleEntry // guarded by modulesMu

// keepLoaded holds one more open of the module's library, once per library,
// never closed.
func keepLoaded(module any) error {
	m, err := as[*Module](module, "KeepLoaded")
	if err != nil {
		return err
	}
	m.ref.mu.RLock()
	defer m.ref.mu.RUnlock()
	if m.ref.closed {
		return fmt.Errorf("dsoop: library %s: %w", m.entry.path, ErrClosed)
	}
	modulesMu.Lock()
	defer modulesMu.Unlock()
	if !m.entry.kept {
		m.entry.kept = true
		m.entry.opens++
		keptEntries = append(keptEntries, m.entry)
	}
	return nil
}

// as gives v as a T, or the error of the accessor named hook, called with a value
// of another type.
func as[T any](v any, hook string) (T, error) {
	t, ok := v.(T)
	if !ok {
		return t, fmt.Errorf("dsoop: %s of a %T", hook, v)
	}
	return t, nil
}

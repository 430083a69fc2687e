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
	native.BorrowFunc = borrowFunc
	native.BorrowVMFunc = borrowVMFunc
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

func borrowFunc(fn any, dst unsafe.Pointer) error {
	f, err := as[*Func](fn, "BorrowFunc")
	if err != nil {
		return err
	}
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	*(*C.DsoopFunction)(dst) = f.ref.fn
	return nil
}

func borrowVMFunc(fn any) (pool unsafe.Pointer, index int32, err error) {
	f, err := as[*VMFunc](fn, "BorrowVMFunc")
	if err != nil {
		return nil, 0, err
	}
	f.ref.mu.RLock()
	defer f.ref.mu.RUnlock()
	if f.ref.closed {
		return nil, 0, fmt.Errorf("dsoop: %s: %w", f.name, ErrClosed)
	}
	return unsafe.Pointer(f.ref.pool.ptr), int32(f.ref.index), nil
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

package dsoop_test

import (
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tvmdsoop/tvmdsoop/dsoop"
	"github.com/tvmdsoop/tvmdsoop/internal/native"
)

func TestConcurrentOpensShareOneLoad(t *testing.T) {
	path := copyLibrary(t, testLib)
	modules := make([]*dsoop.Module, 8)
	require.NoError(t, inParallel(len(modules), func(g int) (err error) {
		modules[g], err = dsoop.Open(path)
		return err
	}))
	for _, m := range modules {
		assert.True(t, dsoop.SharesLoad(modules[0], m))
		require.NoError(t, m.Close())
	}
	assert.False(t, dsoop.Loaded(path), "released with the last Close")
}

// While one Open of a path loads it, Opens of other paths go on, and those of
// the same path wait for it.
func TestOpenWaitsOnlyForItsOwnPath(t *testing.T) {
	slow, other := copyLibrary(t, testLib), copyLibrary(t, testLib)
	unlock := dsoop.LockPath(slow) // as an Open of slow loading it
	defer func() {
		if unlock != nil {
			unlock()
		}
	}()
	type opened struct {
		m   *dsoop.Module
		err error
	}
	open := func(path string) <-chan opened {
		done := make(chan opened, 1)
		go func() {
			m, err := dsoop.Open(path)
			done <- opened{m, err}
		}()
		return done
	}
	result := func(done <-chan opened) *dsoop.Module {
		t.Helper()
		select {
		case o := <-done:
			require.NoError(t, o.err)
			t.Cleanup(func() { o.m.Close() })
			return o.m
		case <-time.After(time.Minute):
			t.Fatal("Open did not return")
			return nil
		}
	}
	result(open(other))

	waiting := open(slow)
	select {
	case <-waiting:
		t.Fatal("an Open of a path did not wait for the one loading it")
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	unlock = nil
	result(waiting)
}

func TestUnclosedModuleIsReleased(t *testing.T) {
	path := copyLibrary(t, testLib)
	func() {
		_, err := dsoop.Open(path)
		require.NoError(t, err)
	}()
	require.True(t, dsoop.Loaded(path))
	assert.Eventually(t, func() bool {
		runtime.GC()
		return !dsoop.Loaded(path)
	}, 30*time.Second, 10*time.Millisecond, "a finaliser closes a Module no one closed")
}

// Lookups of one function share its object (the kernels of a graph then call
// through one that stays in cache); each Func still holds its own reference.
func TestFuncsOfOneFunctionShareItsObject(t *testing.T) {
	path := copyLibrary(t, testLib)
	a, err := dsoop.Open(path)
	require.NoError(t, err)
	b, err := dsoop.Open(path)
	require.NoError(t, err)
	f, err := a.Func("add_one")
	require.NoError(t, err)
	defer f.Close()
	g, err := b.Func("add_one")
	require.NoError(t, err)
	other, err := a.Func("vector_add")
	require.NoError(t, err)
	defer other.Close()
	assert.True(t, dsoop.SameObject(f, g))
	assert.False(t, dsoop.SameObject(f, other))

	require.NoError(t, g.Close())
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.False(t, dsoop.Loaded(path), "released with the last Close")
	out := make([]float32, 2)
	require.NoError(t, f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, out)), "f keeps its own reference")
	assert.Equal(t, []float32{2, 3}, out)
}

// A function its library exports is called through the library's symbol, as
// TVM's library module calls it behind the function object, so no TVM-FFI
// trampoline is on the call's path. It computes what the object did, brings back the
// function's own errors, and works on once its Module is closed: its reference
// to the object keeps the library loaded.
func TestExportedFunctionsAreCalledThroughTheirSymbols(t *testing.T) {
	tests := []struct {
		name string
		lib  string
		fn   string
	}{
		{"built by tvm.compile", testLib, "add_one"},
		{"built with tvm-ffi's C++ macros", ffiLib, "add_int"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := dsoop.Open(copyLibrary(t, tc.lib))
			require.NoError(t, err)
			f, err := m.Func(tc.fn)
			require.NoError(t, err)
			defer f.Close()
			require.True(t, dsoop.CallsSymbol(f))
			require.NoError(t, m.Close())
			if tc.fn == "add_int" {
				got, err := f.CallValue(int64(2), int64(3))
				require.NoError(t, err)
				assert.Equal(t, int64(5), got)
				_, err = f.CallValue(int64(1))
				require.ErrorContains(t, err, "Expected 2 but got 1 arguments", "the function's own check")
				return
			}
			out := make([]float32, 2)
			require.NoError(t, f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, out)))
			assert.Equal(t, []float32{2, 3}, out)
			err = f.Call(mustTensor(t, []float32{1, 2}), mustTensor(t, make([]float32, 3)))
			var tvmErr *dsoop.Error
			require.ErrorAs(t, err, &tvmErr, "TVM's argument check, raised in the compiled code")
		})
	}
}

func TestNativeAccessorsRefuseOtherTypes(t *testing.T) {
	f := openFunc(t, "add_one")
	_, _, err := native.BorrowVMFunc(f)
	assert.ErrorContains(t, err, "BorrowVMFunc of a *dsoop.Func")
	assert.ErrorContains(t, native.RetainFunc(struct{}{}, nil), "RetainFunc of a struct {}")
	assert.ErrorContains(t, native.BorrowFunc(struct{}{}, nil), "BorrowFunc of a struct {}")
	require.NoError(t, f.Close())
	var fn [3]uintptr // a DsoopFunction's room: not written for a closed Func
	assert.ErrorIs(t, native.RetainFunc(f, unsafe.Pointer(&fn)), dsoop.ErrClosed)
	assert.ErrorIs(t, native.BorrowFunc(f, unsafe.Pointer(&fn)), dsoop.ErrClosed)
	assert.Equal(t, [3]uintptr{}, fn)
}

// The loader (glibc's dlopen) hands back a library already loaded from the
// path it is asked for, and libraries load from /proc/self/fd/N: the memfd of
// a library a Func keeps loaded must stay open even when its entry is gone (its
// file was rebuilt in place), or a later library given the same fd number would
// run the kept one's code.
func TestKeptLibraryKeepsItsLoaderPathToItself(t *testing.T) {
	path := copyLibrary(t, ffiLib)
	m, err := dsoop.Open(path)
	require.NoError(t, err)
	kept, err := m.Func("add_int")
	require.NoError(t, err)
	defer kept.Close()
	require.NoError(t, m.Close())
	rebuilt, err := os.ReadFile(testLib)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, rebuilt, 0o644))
	_, f := openAddOne(t, path) // the rebuilt file, loaded anew
	addOneWorks(t, f)
	for range 3 {
		runtime.GC()
	}
	for range 4 {
		_, f := openAddOne(t, copyLibrary(t, testLib))
		addOneWorks(t, f)
	}
	got, err := kept.CallValue(int64(2), int64(3))
	require.NoError(t, err)
	assert.Equal(t, int64(5), got, "the kept library's own code")
}

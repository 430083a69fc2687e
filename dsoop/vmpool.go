package dsoop

/*
#include "vm.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// VMInstancesEnv names the environment variable that bounds the VM instances of
// one model on one device (default: the number of CPUs, as TensorFlow sizes its
// inter-op thread pool).
const VMInstancesEnv = "TVMDSOOP_VM_INSTANCES"

// vmPool is one C pool of VM instances of a module's executable on one device.
// It is freed with its last reference: the module entry's, and each VMFunc's.
type vmPool struct {
	ptr  *C.DsoopVMPool
	refs int // guarded by poolsMu
}

var poolsMu sync.Mutex // guards moduleEntry.pools and vmPool.refs

func (p *vmPool) release() {
	poolsMu.Lock()
	p.refs--
	last := p.refs == 0
	if last {
		C.dsoop_vm_pool_destroy(p.ptr)
	}
	poolsMu.Unlock()
	if last {
		sweepLoaderFiles() // its instances may have held the library's last reference
	}
}

// vmInstances is the bound on a pool's instances.
func vmInstances() (int, error) {
	value := os.Getenv(VMInstancesEnv)
	if value == "" {
		return runtime.NumCPU(), nil
	}
	n, err := strconv.Atoi(value)
	if err != nil || n < 1 || n > 1<<16 {
		return 0, fmt.Errorf("dsoop: %s=%q: want a number of VM instances from 1 to 65536", VMInstancesEnv, value)
	}
	return n, nil
}

// pool is the module's pool of VM instances on device, made at its first use,
// with a new reference for the caller.
func (m *Module) pool(device dlpack.Device) (*vmPool, error) {
	poolsMu.Lock()
	defer poolsMu.Unlock()
	if p, ok := m.entry.pools[device]; ok {
		p.refs++
		return p, nil
	}
	instances, err := vmInstances()
	if err != nil {
		return nil, err
	}
	if m.entry.graph != nil {
		p, err := m.graphPool(device, instances)
		if err != nil {
			return nil, err
		}
		if m.entry.pools == nil {
			m.entry.pools = map[dlpack.Device]*vmPool{}
		}
		m.entry.pools[device] = p
		return p, nil
	}
	var ptr *C.DsoopVMPool
	var cerr C.DsoopError
	if C.dsoop_vm_pool_create(m.entry.handle, C.int32_t(device.Type), C.int32_t(device.ID),
		C.int32_t(instances), &ptr, &cerr) != 0 {
		return nil, fmt.Errorf("dsoop: library %s: cannot start the model's VM on %v: %w", m.entry.path, device, takeError(&cerr))
	}
	p := &vmPool{ptr: ptr, refs: 2} // the entry's and the caller's
	if m.entry.pools == nil {
		m.entry.pools = map[dlpack.Device]*vmPool{}
	}
	m.entry.pools[device] = p
	return p, nil
}

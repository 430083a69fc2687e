package dsoop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/tvmdsoop/tvmdsoop/dlpack"
)

// A Relax VM executable's bytes, as apache-tvm 0.27 writes them
// (src/runtime/vm/executable.cc, SaveToBytes), all little-endian, a vec or str
// being a u64 count and then its items:
//
//	<magic: u64> <version: str>
//	<function table: vec of <kind: i32> <name: str> <start, end, args, registers: i64> <params: vec<str>>>
//	<memory scopes, second magic only: vec of <constant: i64> <scope: str>>
//	<constants: vec of <type index: i32> and a value of that type>
//	<instr_offset: vec<i64>> <instr_data: vec<i64>>
//
// TVM's loader trusts these: its reader allocates what a length claims, sends an
// unknown constant type to a lookup that aborts, and its interpreter indexes
// registers and constants with operands it never bounds. readVMExecutable
// checks every one against what it indexes, so that an executable it accepts
// can be loaded and run, however wrong its results, without a crash.

// vmExecutableKind is the kind of a Relax VM executable's module.
const vmExecutableKind = "relax.VMExecutable"

// The magics: the second version also saves memory scopes, after the table.
const (
	vmExecutableMagic   = 0xD225DE2F4214151D
	vmExecutableMagicV2 = 0xD225DE2F4214151E
)

const (
	vmExecutableVersion = "0.14"
	// Bounds far above what TVM writes, so that a corrupt count is refused
	// before anything is sized by it.
	maxVMFunctions     = 1 << 20
	maxVMRegisters     = 1 << 24
	maxVMNameLength    = 1 << 16
	maxTensorDims      = 64
	maxInstructionArgs = 1 << 20
)

// The kinds of a function table's entries (VMFuncInfo::FuncKind): a kernel or
// builtin looked up by name, a function of the VM's bytecode, and one compiled
// to native code that the VM calls with its register file.
const (
	vmFuncPacked = 0
	vmFuncVM     = 1
	vmFuncVMTIR  = 2
)

// The opcodes of include/tvm/runtime/vm/bytecode.h, and their operands.
const (
	opCall = 1 // dst, function index, argument count, then the arguments
	opRet  = 2 // the register returned
	opGoto = 3 // a pc offset
	opIf   = 4 // the condition's register, the pc offset when it is 0
)

// Registers at and above vmSpecialRegisters are not in the register file: two
// are read (void and the VM itself); a call's result written to any of them is
// dropped.
const (
	vmSpecialRegisters = int64(1) << 54
	vmVoidRegister     = vmSpecialRegisters
	vmContextRegister  = vmSpecialRegisters + 1
)

// An instruction argument is a kind in its top 8 bits and a signed 56-bit value
// (Instruction::Arg).
const (
	argRegister  = 0
	argImmediate = 1
	argConstant  = 2
	argFunction  = 3
)

// The type indices of a constant pool's entries (tvm-ffi's c_api.h, TVMFFITypeIndex).
const (
	constInt      = 1
	constFloat    = 3
	constDataType = 5
	constStr      = 65
	constShape    = 69
	constTensor   = 70
)

// vmFunction is an entry of an executable's function table.
type vmFunction struct {
	kind       int32
	name       string
	start, end int64 // its instructions: [start, end) of instr_offset, for a VM function
	args       int64
	registers  int64
	params     []string
}

// vmExecutable is what readVMExecutable read of one.
type vmExecutable struct {
	functions []vmFunction
	constants int64
}

// entryPoint reports whether f is one of the executable's Relax functions (main,
// forward, ...), in bytecode or compiled to native code, rather than a kernel.
func (f vmFunction) entryPoint() bool { return f.kind == vmFuncVM || f.kind == vmFuncVMTIR }

// vmFunctionNames are the names of the executable's entry points, in table order.
func (e vmExecutable) vmFunctionNames() []string { return e.names(vmFunction.entryPoint) }

// nativeFunctions are the names of the entry points compiled to native code
// (exec_mode="compiled"), in table order.
func (e vmExecutable) nativeFunctions() []string {
	return e.names(func(f vmFunction) bool { return f.kind == vmFuncVMTIR })
}

// names are the names of the functions keep takes, in table order.
func (e vmExecutable) names(keep func(vmFunction) bool) []string {
	var names []string
	for _, f := range e.functions {
		if keep(f) {
			names = append(names, f.name)
		}
	}
	return names
}

// readVMExecutable reads and verifies a Relax VM executable's bytes (see
// above). On an error it returns what it read before it: the function table,
// when that much was readable.
func readVMExecutable(r *binReader) (vmExecutable, error) {
	var e vmExecutable
	magic := r.u64()
	if r.err == nil && magic != vmExecutableMagic && magic != vmExecutableMagicV2 {
		return e, fmt.Errorf("not a Relax VM executable of this TVM (magic %#x)", magic)
	}
	if version := r.strMax(maxNameLength); r.err == nil && version != vmExecutableVersion {
		return e, fmt.Errorf("a Relax VM executable of version %q, not %s", version, vmExecutableVersion)
	}
	if err := e.readFunctionTable(r); err != nil {
		return e, fmt.Errorf("function table: %w", err)
	}
	if magic == vmExecutableMagicV2 {
		for n := r.count(16); r.err == nil && n > 0; n-- {
			r.u64()
			r.strMax(maxVMNameLength)
		}
		if r.err != nil {
			return e, fmt.Errorf("memory scopes: %w", r.err)
		}
	}
	if err := e.readConstants(r); err != nil {
		return e, fmt.Errorf("constant pool: %w", err)
	}
	offsets := r.i64s()
	code := r.i64s()
	if r.err != nil {
		return e, fmt.Errorf("code: %w", r.err)
	}
	for _, f := range e.functions {
		if f.kind != vmFuncVM {
			continue
		}
		if err := e.verifyCode(f, offsets, code); err != nil {
			return e, fmt.Errorf("function %s: %w", f.name, err)
		}
	}
	return e, nil
}

func (e *vmExecutable) readFunctionTable(r *binReader) error {
	n := r.u64()
	if r.err == nil && n > maxVMFunctions {
		return fmt.Errorf("%d entries", n)
	}
	for ; r.err == nil && n > 0; n-- {
		f := vmFunction{kind: int32(r.u32()), name: r.strMax(maxVMNameLength)}
		f.start, f.end, f.args, f.registers = r.i64(), r.i64(), r.i64(), r.i64()
		for p := r.count(8); r.err == nil && p > 0; p-- {
			f.params = append(f.params, r.strMax(maxVMNameLength))
		}
		if r.err != nil {
			break
		}
		switch {
		case f.kind != vmFuncPacked && f.kind != vmFuncVM && f.kind != vmFuncVMTIR:
			return fmt.Errorf("%s is of kind %d", f.name, f.kind)
		case f.kind != vmFuncPacked && (f.registers < 0 || f.registers > maxVMRegisters):
			return fmt.Errorf("%s has %d registers", f.name, f.registers)
		case f.kind != vmFuncPacked && (f.args < 0 || f.args > f.registers):
			// The VM writes the arguments to the first registers.
			return fmt.Errorf("%s takes %d arguments in %d registers", f.name, f.args, f.registers)
		}
		e.functions = append(e.functions, f)
	}
	return r.err
}

func (e *vmExecutable) readConstants(r *binReader) error {
	n := r.count(4)
	for i := uint64(0); r.err == nil && i < n; i++ {
		switch kind := int32(r.u32()); kind {
		case constInt, constFloat:
			r.skip(8)
		case constDataType:
			r.skip(4)
		case constStr:
			r.skip(r.count(1))
		case constShape:
			r.skipWords(r.count(8))
		case constTensor:
			if err := readTensor(r); err != nil {
				return fmt.Errorf("constant %d: %w", i, err)
			}
		default:
			if r.err == nil {
				return fmt.Errorf("constant %d is of type %d", i, kind)
			}
		}
	}
	e.constants = int64(n)
	return r.err
}

// readTensor checks a saved tensor (Tensor::Load): a CPU tensor of whole bytes
// and one lane, whose data TVM's loader reads into a buffer it sizes from the
// shape: the data must be exactly that size, and there.
func readTensor(r *binReader) error {
	t := readSavedTensor(r)
	if r.err != nil {
		return r.err
	}
	bitsPerLane := t.dtype.Bits
	switch {
	case t.deviceType != int32(dlpack.CPU) || t.deviceID != 0:
		return fmt.Errorf("a tensor saved on device %d:%d, not the CPU", t.deviceType, t.deviceID)
	case bitsPerLane == 0 || bitsPerLane%8 != 0 || t.dtype.Lanes != 1:
		// The loader reads (bits+7)/8 bytes an element into bits*lanes/8.
		return fmt.Errorf("a tensor of type code %d, %d bits, %d lanes", t.dtype.Code, bitsPerLane, t.dtype.Lanes)
	}
	elements := uint64(1)
	for _, dim := range t.shape {
		hi, lo := bits.Mul64(elements, uint64(dim))
		if dim < 0 || hi != 0 {
			return fmt.Errorf("a tensor dimension of %d", dim)
		}
		elements = lo
	}
	hi, size := bits.Mul64(elements, uint64(bitsPerLane/8))
	if hi != 0 || t.nbytes < 0 || uint64(t.nbytes) != size {
		return fmt.Errorf("a tensor of %d elements of %d bits holding %d bytes", elements, bitsPerLane, t.nbytes)
	}
	r.skip(size)
	return r.err
}

// instruction is a VM instruction, decoded: the registers it reads and
// writes, where it may go next.
type instruction struct {
	reads  []int64 // registers, special ones included
	writes int64   // a call's result register; -1 for none
	target int64   // Goto's and If's jump, relative; 0 for none
	falls  bool    // whether the next instruction may run after it
}

// maxVerifiedBits bounds the verifier's work on one function: a register set
// per jump target (see verifyCode).
const maxVerifiedBits = 1 << 28

// verifyCode checks a VM function's instructions: each decodes within
// instr_data; its registers are in the function's register file; its
// constants and functions within the pool and the table; its jumps forward and
// within the function, and none runs off its end. And every register an
// instruction reads was written on every path to it, the arguments at entry
// included: the VM hands an unwritten register's None to kernels, which take
// it for a tensor and dereference it. Relax's code generator emits forward
// jumps only (an If, and a Goto past its else branch), so one pass in order
// sees every path to an instruction before the instruction.
func (e *vmExecutable) verifyCode(f vmFunction, offsets, code []int64) error {
	if f.start < 0 || f.start >= f.end || f.end > int64(len(offsets)) {
		return fmt.Errorf("instructions [%d, %d) of %d", f.start, f.end, len(offsets))
	}
	words := (f.registers + 63) / 64
	written := newRegisterSet(words)
	for r := int64(0); r < f.args; r++ {
		written.add(r)
	}
	joins := map[int64]registerSet{} // what is written on every jump to an instruction so far
	reachable := true                // by falling through from the one before
	for pc := f.start; pc < f.end; pc++ {
		in, err := e.decode(f, offsets[pc], code)
		if err != nil {
			return fmt.Errorf("instruction %d: %w", pc, err)
		}
		if join, jumped := joins[pc]; jumped {
			delete(joins, pc)
			if reachable {
				written.intersect(join)
			} else {
				written, reachable = join, true
			}
		}
		if !reachable {
			continue // dead code: nothing reaches it to read what it reads
		}
		for _, reg := range in.reads {
			if reg < vmSpecialRegisters && !written.has(reg) {
				return fmt.Errorf("instruction %d reads register %d before any write to it", pc, reg)
			}
		}
		if in.writes >= 0 {
			written.add(in.writes)
		}
		if in.falls && pc+1 == f.end {
			return fmt.Errorf("instruction %d runs past its function's end", pc)
		}
		if in.target != 0 {
			to := pc + in.target
			if in.target < 0 || to >= f.end {
				return fmt.Errorf("instruction %d jumps to %d, outside its function's [%d, %d) or back", pc, to, f.start, f.end)
			}
			if join, ok := joins[to]; ok {
				join.intersect(written)
			} else {
				if int64(len(joins)+1)*words*64 > maxVerifiedBits {
					return fmt.Errorf("too many jumps over %d registers to verify", f.registers)
				}
				joins[to] = written.clone()
			}
		}
		reachable = in.falls
	}
	return nil
}

// decode decodes the instruction at offset at of code, checking its operands
// against f, the constant pool and the function table.
func (e *vmExecutable) decode(f vmFunction, at int64, code []int64) (instruction, error) {
	operand := func(i int64) (int64, bool) {
		if at < 0 || i >= int64(len(code))-at {
			return 0, false
		}
		return code[at+i], true
	}
	register := func(reg int64) bool {
		return (reg >= 0 && reg < f.registers) || reg == vmVoidRegister || reg == vmContextRegister
	}
	op, ok := operand(0)
	if !ok {
		return instruction{}, fmt.Errorf("at %d of %d words", at, len(code))
	}
	in := instruction{writes: -1}
	switch op {
	case opCall:
		dst, ok1 := operand(1)
		fn, ok2 := operand(2)
		n, ok3 := operand(3)
		switch {
		case !ok1 || !ok2 || !ok3:
			return in, errors.New("a call cut short")
		case n < 0 || n > maxInstructionArgs:
			return in, fmt.Errorf("a call of %d arguments", n)
		case (dst < 0 || dst >= f.registers) && dst < vmSpecialRegisters:
			return in, fmt.Errorf("a call's result goes to register %d of %d", dst, f.registers)
		case fn < 0 || fn >= int64(len(e.functions)):
			return in, fmt.Errorf("calls function %d of %d", fn, len(e.functions))
		}
		if dst < vmSpecialRegisters {
			in.writes = dst // a result for a special register is dropped
		}
		in.falls = true
		for i := int64(0); i < n; i++ {
			word, ok := operand(4 + i)
			if !ok {
				return in, errors.New("a call cut short")
			}
			value := word << 8 >> 8 // the low 56 bits, sign-extended
			switch kind := uint64(word) >> 56; kind {
			case argRegister:
				if !register(value) {
					return in, fmt.Errorf("argument %d is register %d of %d", i, value, f.registers)
				}
				in.reads = append(in.reads, value)
			case argImmediate:
			case argConstant:
				if value < 0 || value >= e.constants {
					return in, fmt.Errorf("argument %d is constant %d of %d", i, value, e.constants)
				}
			case argFunction:
				if value < 0 || value >= int64(len(e.functions)) {
					return in, fmt.Errorf("argument %d is function %d of %d", i, value, len(e.functions))
				}
			default:
				return in, fmt.Errorf("argument %d is of kind %d", i, kind)
			}
		}
	case opRet:
		reg, ok := operand(1)
		if !ok || !register(reg) {
			return in, errors.New("returns a register it does not have")
		}
		in.reads = []int64{reg}
	case opGoto:
		offset, ok := operand(1)
		if !ok || offset <= 0 {
			return in, errors.New("jumps to itself or back")
		}
		in.target = offset
	case opIf:
		cond, ok1 := operand(1)
		offset, ok2 := operand(2)
		switch {
		case !ok1 || !register(cond):
			return in, errors.New("tests a register it does not have")
		case !ok2 || offset <= 1: // the VM refuses these too, at run time
			return in, fmt.Errorf("branches by %d", offset)
		}
		in.reads, in.target, in.falls = []int64{cond}, offset, true
	default:
		return in, fmt.Errorf("opcode %d", op)
	}
	return in, nil
}

// registerSet is a set of a function's registers, a bit each.
type registerSet []uint64

func newRegisterSet(words int64) registerSet { return make(registerSet, words) }
func (s registerSet) add(reg int64)          { s[reg/64] |= 1 << (reg % 64) }
func (s registerSet) has(reg int64) bool     { return s[reg/64]&(1<<(reg%64)) != 0 }
func (s registerSet) clone() registerSet     { return slices.Clone(s) }
func (s registerSet) intersect(o registerSet) {
	for i := range s {
		s[i] &= o[i]
	}
}

// Readers of the fixed-size fields above, on binReader.

func (b *binReader) u8() uint8 {
	if buf := b.read(1); buf != nil {
		return buf[0]
	}
	return 0
}

func (b *binReader) u16() uint16 {
	if buf := b.read(2); buf != nil {
		return binary.LittleEndian.Uint16(buf)
	}
	return 0
}

func (b *binReader) u32() uint32 {
	if buf := b.read(4); buf != nil {
		return binary.LittleEndian.Uint32(buf)
	}
	return 0
}

func (b *binReader) i64() int64 { return int64(b.u64()) }

// count reads a vec's count of items of at least minSize bytes each, refusing
// one that the bytes left cannot hold.
func (b *binReader) count(minSize uint64) uint64 {
	n := b.u64()
	if b.err == nil && n > b.left()/minSize {
		b.err = fmt.Errorf("%d items of %d bytes or more in %d bytes", n, minSize, b.left())
		return 0
	}
	return n
}

// i64s reads a vec<i64>.
func (b *binReader) i64s() []int64 {
	n := b.count(8)
	if n > math.MaxInt32 {
		b.err = fmt.Errorf("a vec of %d words", n)
	}
	raw := b.read(8 * n)
	if raw == nil {
		return nil
	}
	words := make([]int64, n)
	for i := range words {
		words[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
	}
	return words
}

package dsoop

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// encode writes parts little-endian as TVM's stream does: fixed-size integers
// and floats as they are, a string as a str, a []int64 as a vec, []byte raw.
func encode(parts ...any) []byte {
	var b bytes.Buffer
	for _, p := range parts {
		switch v := p.(type) {
		case string:
			binary.Write(&b, binary.LittleEndian, uint64(len(v)))
			b.WriteString(v)
		case []int64:
			binary.Write(&b, binary.LittleEndian, uint64(len(v)))
			binary.Write(&b, binary.LittleEndian, v)
		case []byte:
			b.Write(v)
		default:
			if err := binary.Write(&b, binary.LittleEndian, v); err != nil {
				panic(err)
			}
		}
	}
	return b.Bytes()
}

// testExecutable is an executable in parts, to be changed one at a time:
// a kernel and a VM function main(x) { r1 = kernel(x, constants[1]); return r1 }.
type testExecutable struct {
	magic     uint64
	version   string
	table     []vmFunction
	constants [][]byte // each its type index and its value, encoded
	offsets   []int64
	code      []int64
}

// arg encodes an instruction argument: its kind in the top 8 bits.
func arg(kind, value int64) int64 { return kind<<56 | value&(1<<56-1) }

// tensorConstant is a saved float32 tensor of the given shape holding n bytes.
func tensorConstant(shape []int64, n int64) []byte {
	parts := []any{int32(constTensor), uint64(tensorMagic), uint64(0), int32(1), int32(0), int32(len(shape)),
		uint8(2), uint8(32), uint16(1)}
	for _, d := range shape {
		parts = append(parts, d)
	}
	return encode(append(parts, n, make([]byte, max(n, 0)))...)
}

func validExecutable() testExecutable {
	return testExecutable{
		magic:   vmExecutableMagic,
		version: vmExecutableVersion,
		table: []vmFunction{
			{kind: vmFuncPacked, name: "add_kernel"},
			{kind: vmFuncVM, name: "main", start: 0, end: 2, args: 1, registers: 2, params: []string{"x"}},
		},
		constants: [][]byte{encode(int32(constInt), int64(7)), tensorConstant([]int64{2}, 8)},
		offsets:   []int64{0, 6},
		code:      []int64{opCall, 1, 0, 2, arg(argRegister, 0), arg(argConstant, 1), opRet, 1},
	}
}

// withBranches makes main an if-else: r1 = kernel() when x, else r1 =
// kernel() with its result to elseResult; then return r1.
func withBranches(elseResult int64) func(e *testExecutable) {
	return func(e *testExecutable) {
		e.table[1].end = 5
		e.offsets = []int64{0, 3, 7, 9, 13}
		e.code = []int64{opIf, 0, 3, opCall, 1, 0, 0, opGoto, 2, opCall, elseResult, 0, 0, opRet, 1}
	}
}

func (e testExecutable) bytes() []byte {
	parts := []any{e.magic, e.version, uint64(len(e.table))}
	for _, f := range e.table {
		parts = append(parts, f.kind, f.name, f.start, f.end, f.args, f.registers, uint64(len(f.params)))
		for _, p := range f.params {
			parts = append(parts, p)
		}
	}
	if e.magic == vmExecutableMagicV2 {
		parts = append(parts, uint64(1), int64(1), "global")
	}
	parts = append(parts, uint64(len(e.constants)))
	for _, c := range e.constants {
		parts = append(parts, c)
	}
	return encode(append(parts, e.offsets, e.code)...)
}

func TestReadVMExecutable(t *testing.T) {
	main := func(e *testExecutable) *vmFunction { return &e.table[1] }
	tests := []struct {
		name   string
		change func(e *testExecutable)
		want   string // in the error; "" for an executable that passes
	}{
		{"as TVM writes one", func(*testExecutable) {}, ""},
		{"the second version, with memory scopes", func(e *testExecutable) { e.magic = vmExecutableMagicV2 }, ""},
		{"a call's result dropped", func(e *testExecutable) { e.code[1], e.code[7] = vmVoidRegister, vmVoidRegister }, ""},
		{"returns the VM", func(e *testExecutable) { e.code[7] = vmContextRegister }, ""},
		{"a name of 300 bytes", func(e *testExecutable) { e.table[0].name = string(make([]byte, 300)) }, ""},
		{"another magic", func(e *testExecutable) { e.magic = 1 }, "magic"},
		{"another VM version", func(e *testExecutable) { e.version = "0.13" }, "version"},
		{"a function of kind 7", func(e *testExecutable) { e.table[0].kind = 7 }, "kind 7"},
		{"-1 registers", func(e *testExecutable) { main(e).registers = -1 }, "-1 registers"},
		{"2^30 registers", func(e *testExecutable) { main(e).registers = 1 << 30 }, "registers"},
		{"more arguments than registers", func(e *testExecutable) { main(e).args = 3 }, "3 arguments in 2 registers"},
		{"a constant of type 77", func(e *testExecutable) { e.constants[0] = encode(int32(77)) }, "type 77"},
		{"a string of 2^40 bytes", func(e *testExecutable) { e.constants[0] = encode(int32(constStr), uint64(1<<40)) }, "items"},
		{"a shape of 2^40 dimensions", func(e *testExecutable) { e.constants[0] = encode(int32(constShape), uint64(1<<40)) }, "items"},
		{"a tensor of another magic", func(e *testExecutable) { e.constants[1][4] ^= 1 }, "a tensor of magic"},
		{"a tensor on a GPU", func(e *testExecutable) { e.constants[1][20] = 2 }, "device 2:0"},
		{"a tensor of -1 dimensions", func(e *testExecutable) { e.constants[1][28] = 0xff }, "dimensions"},
		{"a tensor of 4-bit elements", func(e *testExecutable) { e.constants[1][33] = 4 }, "4 bits"},
		{"a tensor of 4 lanes", func(e *testExecutable) { e.constants[1][34] = 4 }, "4 lanes"},
		{"a tensor dimension of -2", func(e *testExecutable) { e.constants[1] = tensorConstant([]int64{-2}, 8) }, "dimension of -2"},
		{"a tensor of 2^80 elements", func(e *testExecutable) { e.constants[1] = tensorConstant([]int64{1 << 40, 1 << 40}, 0) }, "dimension"},
		{"a tensor's data of the wrong size", func(e *testExecutable) { e.constants[1] = tensorConstant([]int64{2}, 4) }, "holding 4 bytes"},
		{"a tensor's data cut short", func(e *testExecutable) {
			e.constants[1] = tensorConstant([]int64{2}, 8)[:40]
			e.offsets, e.code = nil, nil
		}, "constant pool"},
		{"a function past the code", func(e *testExecutable) { main(e).end = 3 }, "instructions [0, 3) of 2"},
		{"a function without instructions", func(e *testExecutable) { main(e).end = 0 }, "instructions [0, 0)"},
		{"an instruction past the code", func(e *testExecutable) { e.offsets[1] = 8 }, "instruction 1: at 8 of 8 words"},
		{"an instruction at -1", func(e *testExecutable) { e.offsets[1] = -1 }, "instruction 1: at -1"},
		{"opcode 9", func(e *testExecutable) { e.code[6] = 9 }, "opcode 9"},
		{"a result to register 2 of 2", func(e *testExecutable) { e.code[1] = 2 }, "register 2 of 2"},
		{"a result to register -1", func(e *testExecutable) { e.code[1] = -1 }, "register -1 of 2"},
		{"a call of function 2 of 2", func(e *testExecutable) { e.code[2] = 2 }, "function 2 of 2"},
		{"a call of 2^40 arguments", func(e *testExecutable) { e.code[3] = 1 << 40 }, "arguments"},
		{"a call cut short", func(e *testExecutable) { e.code = e.code[:5] }, "cut short"},
		{"argument register 2", func(e *testExecutable) { e.code[4] = arg(argRegister, 2) }, "register 2 of 2"},
		{"argument register -1", func(e *testExecutable) { e.code[4] = arg(argRegister, -1) }, "register -1 of 2"},
		{"argument constant 2 of 2", func(e *testExecutable) { e.code[5] = arg(argConstant, 2) }, "constant 2 of 2"},
		{"argument constant -1", func(e *testExecutable) { e.code[5] = arg(argConstant, -1) }, "constant -1"},
		{"argument function 2 of 2", func(e *testExecutable) { e.code[5] = arg(argFunction, 2) }, "function 2 of 2"},
		{"an argument of kind 9", func(e *testExecutable) { e.code[5] = arg(9, 0) }, "kind 9"},
		{"a call as the last instruction", func(e *testExecutable) { main(e).end = 1 }, "past its function's end"},
		{"returns register 5", func(e *testExecutable) { e.code[7] = 5 }, "returns a register"},
		{"returns special register 9", func(e *testExecutable) { e.code[7] = vmSpecialRegisters + 9 }, "returns a register"},
		{"a jump to itself", func(e *testExecutable) { e.code[6], e.code[7] = opGoto, 0 }, "jumps to itself or back"},
		{"a jump back", func(e *testExecutable) { e.code[6], e.code[7] = opGoto, -1 }, "jumps to itself or back"},
		{"a branch by offset 1", func(e *testExecutable) {
			e.code = append(e.code[:6], opIf, 0, 1)
		}, "branches by 1"},
		{"a branch on register 3", func(e *testExecutable) {
			e.code = append(e.code[:6], opIf, 3, 2)
		}, "tests a register"},
		{"reads a register before any write", func(e *testExecutable) { e.code[4] = arg(argRegister, 1) }, "reads register 1 before any write"},
		{"returns a register never written", func(e *testExecutable) { e.code[1] = vmVoidRegister }, "reads register 1 before"},
		{"both branches write the result", withBranches(1), ""},
		{"one branch leaves the result unwritten", withBranches(vmVoidRegister), "instruction 4 reads register 1 before"},
		{"a jump past the function", func(e *testExecutable) {
			withBranches(1)(e)
			e.code[8] = 3
		}, "jumps to 5"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := validExecutable()
			tc.change(&e)
			bin := e.bytes()
			got, err := readVMExecutable(&binReader{r: bytes.NewReader(bin), limit: uint64(len(bin))})
			if tc.want != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.want)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, []string{"main"}, got.vmFunctionNames())
			assert.Equal(t, int64(2), got.constants)
		})
	}
}

// FuzzReadVMExecutable: whatever bytes an executable holds, the verifier
// answers, without panicking or allocating what a count claims; and what it
// accepts has every VM function's instructions in range (TVM's interpreter
// reads them unchecked). make fuzz explores further; FuzzCorruptedModelRuns
// (dsoop_test) runs what it accepts in TVM's VM.
func FuzzReadVMExecutable(f *testing.F) {
	f.Add(validExecutable().bytes())
	v2 := validExecutable()
	v2.magic = vmExecutableMagicV2
	f.Add(v2.bytes())
	f.Fuzz(func(t *testing.T, bin []byte) {
		e, err := readVMExecutable(&binReader{r: bytes.NewReader(bin), limit: uint64(len(bin))})
		if err != nil {
			return
		}
		for _, fn := range e.functions {
			if fn.kind == vmFuncVM && (fn.start < 0 || fn.start >= fn.end || fn.args > fn.registers) {
				t.Fatalf("accepted %+v", fn)
			}
		}
	})
}

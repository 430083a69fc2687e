package auto

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// workerIdle is how long a compile worker waits for its next request before it
// is told to go: a server holds no Python and TensorFlow beyond its compiles.
var workerIdle = 60 * time.Second

// errWorkerGone is a worker that ended before it answered; errTimeout, one
// that did not answer in time.
var (
	errWorkerGone = errors.New("the compile worker ended")
	errTimeout    = errors.New("timeout")
)

// worker is one `python -m tf_op.compiler.cluster`, which answers one request
// a line (cluster.py) and is kept for the next compiles: each one after the
// first is spared the start of Python and TensorFlow. It runs with the pass off
// (no TVMDSOOP_AUTO), in its own process group, which goes whole when a
// compile takes too long.
type worker struct {
	python  string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	answers chan string   // its answer lines; closed when its stdout ends
	stderr  *tailBuffer   // the last of what it printed besides, for errors
	exited  chan struct{} // closed when the process has been waited for
	waitErr error         // what waiting for it gave; set before exited closes
}

// The worker, if one is running; compiles take it one at a time.
var (
	workerMu  sync.Mutex
	running   *worker
	idleTimer *time.Timer
)

func startWorker(python string) (*worker, error) {
	cmd := exec.Command(python, "-m", "tf_op.compiler.cluster")
	cmd.Env = workerEnv(os.Environ())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// A pipe of our own, not StdoutPipe's, which Wait closes as soon as the
	// process ends: a worker that answers and ends at once would lose its answer.
	stdout, childStdout, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	w := &worker{python: python, cmd: cmd, stdin: stdin, answers: make(chan string, 1),
		stderr: &tailBuffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = childStdout, w.stderr
	err = cmd.Start()
	childStdout.Close()
	if err != nil {
		stdout.Close()
		return nil, fmt.Errorf("cannot start %s -m tf_op.compiler.cluster: %w", python, err)
	}
	go func() {
		defer stdout.Close()
		scanner := bufio.NewScanner(stdout)
		scanner.Buffer(make([]byte, 64*1024), 16*1024*1024)
		for scanner.Scan() {
			line := scanner.Text()
			if strings.HasPrefix(line, resultPrefix) || strings.HasPrefix(line, errorPrefix) {
				w.answers <- line
			} else {
				w.stderr.Write([]byte(line + "\n"))
			}
		}
		close(w.answers)
	}()
	go func() {
		w.waitErr = cmd.Wait()
		close(w.exited)
	}()
	return w, nil
}

// kill ends the worker's whole process group (the TVM worker it runs too).
func (w *worker) kill() {
	_ = syscall.Kill(-w.cmd.Process.Pid, syscall.SIGKILL)
	<-w.exited
}

// close lets the worker end on its own: the end of its requests.
func (w *worker) close() {
	_ = w.stdin.Close()
}

// ask sends one request and waits for its answer, at most timeout. A request
// that cannot be written (the worker ended) still waits for what the worker
// printed before it ended: its answer, or the end of its output.
func (w *worker) ask(request []byte, timeout time.Duration) (string, error) {
	_, _ = w.stdin.Write(append(request, '\n'))
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case line, ok := <-w.answers:
		if !ok {
			return "", errWorkerGone
		}
		return line, nil
	case <-timer.C:
		return "", errTimeout
	}
}

// askWorker has a worker of python answer request: the running one, or a new
// one where there is none, it runs another Python, or it ended (it is tried
// again once with a new one then: a worker may end between two compiles).
func askWorker(python string, request []byte, timeout time.Duration) (string, error) {
	workerMu.Lock()
	defer workerMu.Unlock()
	if idleTimer != nil {
		idleTimer.Stop()
	}
	for attempt := 0; ; attempt++ {
		fresh := false
		if running == nil || running.python != python {
			if running != nil {
				running.close()
			}
			w, err := startWorker(python)
			if err != nil {
				running = nil
				return "", err
			}
			running, fresh = w, true
		}
		w := running
		line, err := w.ask(request, timeout)
		switch {
		case err == nil:
			idleTimer = time.AfterFunc(workerIdle, func() { closeIdle(w) })
			return line, nil
		case errors.Is(err, errTimeout):
			w.kill()
			running = nil
			return "", err
		default: // it ended
			running = nil
			<-w.exited
			if fresh || attempt > 0 {
				return "", fmt.Errorf("%s -m tf_op.compiler.cluster failed (%v):\n%s", python, w.waitErr,
					tail(w.stderr.String()))
			}
		}
	}
}

// stopWorker lets the worker go once no compile runs (tf_op.auto.disable()).
func stopWorker() {
	workerMu.Lock()
	defer workerMu.Unlock()
	if running != nil {
		running.close()
		running = nil
	}
}

// closeIdle lets w go if it is still the worker and no compile came since.
func closeIdle(w *worker) {
	workerMu.Lock()
	defer workerMu.Unlock()
	if running == w {
		w.close()
		running = nil
	}
}

// tailBuffer keeps the last tailBytes of what is written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailBytes = 64 * 1024

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > tailBytes {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-tailBytes:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

package criu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/checkpoint-restore/go-criu/v7/rpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// swrkFd is the descriptor CRIU serves its socket on ("criu swrk 3"): the
// first of the command's ExtraFiles. Files passed along follow it (4, ...).
const swrkFd = 3

// exitWait bounds how long closing a CRIU waits for it to exit after its
// socket closed, and again after it was killed.
const exitWait = 10 * time.Second

// swrk is one CRIU process in swrk mode and our end of the socket it
// serves its requests on. go-criu's client is not used: its socket pair is
// made without close-on-exec (a CRIU started at the same moment inherited
// the other end and never exited), and it keeps the process to itself, so
// a run that does not finish could be neither killed nor given a deadline.
type swrk struct {
	cmd  *exec.Cmd
	sk   *os.File      // non-blocking, so reads take deadlines
	done chan struct{} // closed once the process is reaped
	werr error         // its exit, once done is closed
}

// startSwrk starts CRIU in swrk mode, handing it extra after its socket.
// Both ends of the socket pair are close-on-exec from the start, and extra
// files reach CRIU through dup2 in the child only: no other child started
// at the same moment inherits any of them.
func startSwrk(path string, extra ...*os.File) (*swrk, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("criu socket pair: %w", err)
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return nil, fmt.Errorf("criu socket: %w", err)
	}
	cln := os.NewFile(uintptr(fds[0]), "criu-swrk-client")
	srv := os.NewFile(uintptr(fds[1]), "criu-swrk-server")
	defer srv.Close()
	cmd := exec.Command(path, "swrk", strconv.Itoa(swrkFd))
	cmd.ExtraFiles = append([]*os.File{srv}, extra...)
	if err := cmd.Start(); err != nil {
		cln.Close()
		return nil, err
	}
	s := &swrk{cmd: cmd, sk: cln, done: make(chan struct{})}
	go func() {
		s.werr = cmd.Wait()
		close(s.done)
	}()
	return s, nil
}

// pid is the CRIU process's pid.
func (s *swrk) pid() int { return s.cmd.Process.Pid }

// kill ends the CRIU process (SIGKILL); reading its socket then ends too.
func (s *swrk) kill() { s.cmd.Process.Kill() }

// call sends req and answers CRIU's notifications with onNotify until the
// final response. ctx bounds the run: when it ends the CRIU is killed and
// call returns an error wrapping ErrTimeout (deadline) or ctx.Err().
func (s *swrk) call(ctx context.Context, req *rpc.CriuReq, onNotify func(*rpc.CriuNotify) error) (*rpc.CriuResp, error) {
	stop := context.AfterFunc(ctx, s.kill)
	defer stop()
	if d, ok := ctx.Deadline(); ok {
		s.sk.SetDeadline(d)
		defer s.sk.SetDeadline(time.Time{})
	}
	typ := req.GetType()
	buf := make([]byte, 2*4096)
	for {
		b, err := proto.Marshal(req)
		if err != nil {
			return nil, err
		}
		if _, err := s.sk.Write(b); err != nil {
			return nil, s.broken(ctx, "send request", err)
		}
		n, err := s.sk.Read(buf)
		if err == nil && n == 0 {
			err = errors.New("criu closed its socket")
		}
		if err != nil {
			return nil, s.broken(ctx, "read response", err)
		}
		resp := &rpc.CriuResp{}
		if err := proto.Unmarshal(buf[:n], resp); err != nil {
			return nil, fmt.Errorf("decode criu response: %w", err)
		}
		if !resp.GetSuccess() {
			return resp, fmt.Errorf("operation failed (msg:%s err:%d)", resp.GetCrErrmsg(), resp.GetCrErrno())
		}
		if resp.GetType() != rpc.CriuReqType_NOTIFY {
			if resp.GetType() != typ {
				return resp, fmt.Errorf("criu answered %v to %v", resp.GetType(), typ)
			}
			return resp, nil
		}
		if onNotify != nil {
			if err := onNotify(resp.GetNotify()); err != nil {
				return resp, err
			}
		}
		req = &rpc.CriuReq{Type: rpc.CriuReqType_NOTIFY.Enum(), NotifySuccess: proto.Bool(true)}
	}
}

// broken explains a failed exchange: a run that outlived ctx was killed.
func (s *swrk) broken(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
		s.kill()
		cause := ctx.Err()
		if cause == nil || errors.Is(cause, context.DeadlineExceeded) {
			cause = ErrTimeout
		}
		return fmt.Errorf("criu (pid %d) killed: %w", s.pid(), cause)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// close ends the CRIU: closing its socket makes a waiting swrk exit; one
// that does not within exitWait is killed. It returns once the process is
// reaped, or with an error if even a SIGKILL did not end it within
// exitWait (the reaping goroutine then stays until it does).
func (s *swrk) close() error {
	s.sk.Close()
	select {
	case <-s.done:
		return nil
	case <-time.After(exitWait):
	}
	s.kill()
	select {
	case <-s.done:
		return fmt.Errorf("criu (pid %d) did not exit after its socket closed: killed", s.pid())
	case <-time.After(exitWait):
		return fmt.Errorf("criu (pid %d) %w: still running %v after SIGKILL", s.pid(), ErrTimeout, exitWait)
	}
}

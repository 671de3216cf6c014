package inspector

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBounded(t *testing.T) {
	block := func(release chan struct{}) func() (int, error) {
		return func() (int, error) { <-release; return 1, nil }
	}
	tests := []struct {
		name    string
		ctx     func() (context.Context, context.CancelFunc)
		f       func(release chan struct{}) func() (int, error)
		want    int
		wantErr []error
		notErr  error
	}{
		{
			name: "answers",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Minute)
			},
			f: func(chan struct{}) func() (int, error) {
				return func() (int, error) { return 7, nil }
			},
			want: 7,
		},
		{
			name: "f's own error",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), time.Minute)
			},
			f: func(chan struct{}) func() (int, error) {
				return func() (int, error) { return 0, errors.ErrUnsupported }
			},
			wantErr: []error{errors.ErrUnsupported},
			notErr:  ErrStalled,
		},
		{
			name: "deadline while blocked: stalled",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 20*time.Millisecond)
			},
			f:       block,
			wantErr: []error{ErrStalled, context.DeadlineExceeded},
		},
		{
			name: "cancelled while blocked: the caller's, not a stall",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(20*time.Millisecond, cancel)
				return ctx, cancel
			},
			f:       block,
			wantErr: []error{context.Canceled},
			notErr:  ErrStalled,
		},
		{
			name: "already cancelled: f does not run",
			ctx: func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			f: func(chan struct{}) func() (int, error) {
				return func() (int, error) { panic("ran") }
			},
			wantErr: []error{context.Canceled},
		},
		{
			name: "deadline already passed: stalled, f does not run",
			ctx: func() (context.Context, context.CancelFunc) {
				return context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			},
			f: func(chan struct{}) func() (int, error) {
				return func() (int, error) { panic("ran") }
			},
			wantErr: []error{ErrStalled, context.DeadlineExceeded},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			release := make(chan struct{})
			defer close(release) // lets an abandoned f finish
			got, err := bounded(ctx, tt.f(release))
			for _, w := range tt.wantErr {
				if !errors.Is(err, w) {
					t.Errorf("err %v, want %v", err, w)
				}
			}
			if len(tt.wantErr) == 0 && err != nil {
				t.Errorf("err %v", err)
			}
			if tt.notErr != nil && errors.Is(err, tt.notErr) {
				t.Errorf("err %v is %v", err, tt.notErr)
			}
			if got != tt.want {
				t.Errorf("got %d, want %d", got, tt.want)
			}
		})
	}
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// runCRIReset stops and removes every pod sandbox the container runtime
// holds, through the CRI as the kubelet would: stopping a sandbox is what
// makes containerd run the CNI DEL (the pod's address and bridge port go)
// and tear down its network namespace. Run it with the kubelet stopped, or the kubelet starts the pods again.
func runCRIReset(args []string) error {
	fs := flag.NewFlagSet("cri-reset", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "", "the CRI socket (required)")
	timeout := fs.Duration("timeout", 90*time.Second, "how long to wait for all pods to stop")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *endpoint == "" {
		return errors.New("cri-reset: -endpoint is required")
	}
	conn, err := grpc.NewClient("unix://"+*endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("dialing %s: %w", *endpoint, err)
	}
	defer conn.Close()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	list, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("listing pod sandboxes: %w", err)
	}
	var errs []error
	for _, sb := range list.Items {
		if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stopping pod %s/%s: %w", sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err))
			continue
		}
		if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("removing pod %s/%s: %w", sb.Metadata.GetNamespace(), sb.Metadata.GetName(), err))
		}
	}
	fmt.Fprintf(os.Stderr, "cri-reset: %d pod sandboxes stopped and removed\n", len(list.Items)-len(errs))
	return errors.Join(errs...)
}

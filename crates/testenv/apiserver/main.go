// kactor-apiserver: a real Kubernetes API server for kactor's tests, in one process.
//
// It starts an embedded etcd and kube-apiserver (k8s.io/kubernetes/cmd/kube-apiserver/app), then the
// controllers that a cluster's objects rely on without any node: the garbage collector (owner
// references), the namespace controller (namespace deletion), the service account controller (the
// `default` service account of each namespace) and the PVC and PV protection controllers (their
// finalizers), as kube-controller-manager in a child process of the
// same binary (the two components keep process-wide state, signal handlers and feature gates, that
// must not be shared). Everything listens on 127.0.0.1 with generated certificates; clients
// authenticate with a bearer token.
//
// When the server is ready it writes a kubeconfig and prints one line on stdout:
//
//	kactor-apiserver: ready at https://127.0.0.1:PORT kubeconfig PATH
//
// It stops cleanly on SIGTERM or SIGINT (and, with -exit-with-stdin, when its standard input closes,
// so that a test process that dies takes its server with it) and removes the state directory it made.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

// The controllers of kube-controller-manager that a cluster without nodes still needs: owner
// references, namespace deletion, each namespace's `default` service account, and the release of
// the protection finalizers that admission puts on PVCs and PVs.
const controllers = "garbage-collector-controller,namespace-controller,serviceaccount-controller," +
	"persistentvolumeclaim-protection-controller,persistentvolume-protection-controller"

func main() {
	if len(os.Args) > 1 && os.Args[1] == "controller-manager" {
		cmd := kcm.NewControllerManagerCommand()
		cmd.SetArgs(os.Args[2:])
		if err := cmd.Execute(); err != nil {
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "kactor-apiserver: error: %v\n", err)
		os.Exit(1)
	}
}

type options struct {
	dir           string
	kubeconfig    string
	port          int
	rbac          bool
	verbosity     int
	exitWithStdin bool
	readyTimeout  time.Duration
}

func run() error {
	var o options
	flag.StringVar(&o.dir, "dir", "", "state directory (etcd data, certificates); default: a new temporary directory, removed on exit")
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "where to write the kubeconfig (default: DIR/kubeconfig)")
	flag.IntVar(&o.port, "port", 0, "the API server's HTTPS port on 127.0.0.1 (0: a free port)")
	flag.BoolVar(&o.rbac, "rbac", false, "authorize with RBAC (the admin token is in system:masters); default: allow every request")
	flag.IntVar(&o.verbosity, "v", 0, "the components' log verbosity (klog's --v)")
	flag.BoolVar(&o.exitWithStdin, "exit-with-stdin", false, "stop when standard input closes")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 2*time.Minute, "how long to wait for the server to become ready")
	flag.Parse()

	ownDir := o.dir == ""
	if ownDir {
		dir, err := os.MkdirTemp("", "kactor-apiserver-")
		if err != nil {
			return err
		}
		o.dir = dir
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return err
	}
	if o.kubeconfig == "" {
		o.kubeconfig = filepath.Join(o.dir, "kubeconfig")
	}
	certs := filepath.Join(o.dir, "pki")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return err
	}

	ca, err := writeCertificates(certs)
	if err != nil {
		return fmt.Errorf("generating certificates: %w", err)
	}
	token, err := randomToken()
	if err != nil {
		return err
	}
	tokens := filepath.Join(certs, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(token+",kactor-admin,kactor-admin,\"system:masters\"\n"), 0o600); err != nil {
		return err
	}

	port := o.port
	if port == 0 {
		if port, err = freePort(); err != nil {
			return err
		}
	}
	server := fmt.Sprintf("https://127.0.0.1:%d", port)

	etcd, etcdURL, err := startEtcd(filepath.Join(o.dir, "etcd"))
	if err != nil {
		return fmt.Errorf("starting etcd: %w", err)
	}
	defer etcd.Close()

	authorization := "AlwaysAllow"
	if o.rbac {
		authorization = "Node,RBAC"
	}
	// The API server's command stops it on SIGTERM and SIGINT; this process hears them too.
	stop := make(chan os.Signal, 2)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	cmd := apiserver.NewAPIServerCommand()
	cmd.SetArgs([]string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + certs,
		"--tls-cert-file=" + filepath.Join(certs, "server.crt"),
		"--tls-private-key-file=" + filepath.Join(certs, "server.key"),
		"--client-ca-file=" + filepath.Join(certs, "ca.crt"),
		"--token-auth-file=" + tokens,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(certs, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(certs, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=" + authorization,
		"--profiling=false",
		"--v=" + strconv.Itoa(o.verbosity),
	})
	// exited hears of the first component to stop: the API server, then the controller manager.
	exited := make(chan error, 2)
	apiserverDone := make(chan struct{})
	go func() {
		err := cmd.Execute()
		close(apiserverDone)
		exited <- fmt.Errorf("kube-apiserver exited: %v", err)
	}()

	if o.exitWithStdin {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		}()
	}

	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool()}},
	}
	ready := func(path string) func() bool {
		return func() bool {
			req, _ := http.NewRequest(http.MethodGet, server+path, nil)
			req.Header.Set("Authorization", "Bearer "+token)
			resp, err := client.Do(req)
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		}
	}
	deadline := time.Now().Add(o.readyTimeout)
	if err := waitFor(deadline, exited, ready("/readyz")); err != nil {
		return fmt.Errorf("waiting for kube-apiserver: %w", err)
	}
	if err := writeKubeconfig(o.kubeconfig, server, ca.pem, token); err != nil {
		return err
	}

	manager := exec.Command(os.Args[0], "controller-manager",
		"--kubeconfig="+o.kubeconfig,
		"--controllers="+controllers,
		"--leader-elect=false",
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--v="+strconv.Itoa(o.verbosity),
	)
	manager.Stdout, manager.Stderr = os.Stderr, os.Stderr
	// The manager dies with this process, however it ends.
	manager.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := manager.Start(); err != nil {
		return fmt.Errorf("starting kube-controller-manager: %w", err)
	}
	managerDone := make(chan struct{})
	go func() {
		err := manager.Wait()
		close(managerDone)
		exited <- fmt.Errorf("kube-controller-manager exited: %v", err)
	}()
	defer func() { _ = manager.Process.Kill() }() // on every way out; an error once it has exited

	// Ready means what a test needs: namespaces that accept pods (their `default` service account).
	serviceAccount := ready("/api/v1/namespaces/default/serviceaccounts/default")
	if err := waitFor(deadline, exited, serviceAccount); err != nil {
		return fmt.Errorf("waiting for the default service account: %w", err)
	}
	fmt.Printf("kactor-apiserver: ready at %s kubeconfig %s\n", server, o.kubeconfig)

	select {
	case <-stop:
	case err := <-exited:
		return err
	case <-etcd.Err():
		return errors.New("etcd failed")
	}
	// Stopping: the controller manager first (the API server's graceful shutdown would wait for its
	// watches), then a short grace for the API server's own shutdown, then etcd; a test cluster keeps
	// nothing, so there is no drain to wait for beyond that.
	_ = manager.Process.Kill()
	<-managerDone
	select {
	case <-apiserverDone:
	case <-time.After(3 * time.Second):
	}
	return nil
}

// waitFor polls check until it holds, a component exits, or the deadline passes.
func waitFor(deadline time.Time, exited chan error, check func() bool) error {
	for {
		if check() {
			return nil
		}
		select {
		case err := <-exited:
			return err
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("not ready in time")
		}
	}
}

func startEtcd(dir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}
	cfg := embed.NewConfig()
	cfg.Name = "kactor"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	// A test cluster's data need not survive a power cut: no fsync makes every write much faster.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, clientURL.String(), nil
	case err := <-e.Err():
		e.Close()
		return nil, "", err
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("etcd was not ready within 60 s")
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

type authority struct {
	cert *x509.Certificate
	pem  []byte
}

func (a authority) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(a.cert)
	return p
}

// writeCertificates makes a CA, the serving certificate for 127.0.0.1 and localhost, and the service
// account signing key, in dir.
func writeCertificates(dir string) (authority, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return authority{}, err
	}
	now := time.Now()
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kactor-apiserver-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return authority{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return authority{}, err
	}
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return authority{}, err
	}
	serverTemplate := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1"), net.ParseIP("10.0.0.1")},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, serverTemplate, caCert, &serverKey.PublicKey, caKey)
	if err != nil {
		return authority{}, err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return authority{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	files := map[string][]byte{
		"ca.crt":     caPEM,
		"server.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serverDER}),
	}
	for name, key := range map[string]*ecdsa.PrivateKey{"server.key": serverKey, "sa.key": saKey} {
		der, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return authority{}, err
		}
		files[name] = pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return authority{}, err
	}
	files["sa.pub"] = pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub})
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return authority{}, err
		}
	}
	return authority{cert: caCert, pem: caPEM}, nil
}

// writeKubeconfig writes the admin's kubeconfig atomically: a reader never sees half of it.
func writeKubeconfig(path, server string, caPEM []byte, token string) error {
	config := strings.Join([]string{
		"apiVersion: v1",
		"kind: Config",
		"clusters:",
		"- name: kactor-apiserver",
		"  cluster:",
		"    server: " + server,
		"    certificate-authority-data: " + base64.StdEncoding.EncodeToString(caPEM),
		"users:",
		"- name: kactor-admin",
		"  user:",
		"    token: " + token,
		"contexts:",
		"- name: kactor-apiserver",
		"  context:",
		"    cluster: kactor-apiserver",
		"    user: kactor-admin",
		"    namespace: default",
		"current-context: kactor-apiserver",
		"",
	}, "\n")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(config), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

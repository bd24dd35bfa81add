//! The command line every kactor operator accepts, as Kopf's `kopf run`: which namespaces to serve
//! (`-n`, `-A`) and how to log (`-v`, `-d`, `-q`, `--log-format`, `--log-refkey`, `--log-prefix`).
//!
//! `run` is the default command, so `my-operator -n team-a` and `my-operator run -n team-a` are the
//! same. Every option can also come from an environment variable `KACTOR_...` (Kopf's are
//! `KOPF_RUN_...`), which a Deployment sets more easily than arguments; the command line wins.
//!
//! The other commands print what the operator needs in a cluster ([`Manifests`]):
//! `rbac generate [-o FILE]` its ServiceAccount, Roles and bindings, `rbac verify [-f FILE]` which of
//! those permissions some manifests grant, `crds` its CRDs, `manifests` all of it with a Deployment,
//! and `olm bundle` an Operator Lifecycle Manager bundle of it. The rbac commands take the options of
//! `run`, since the permissions depend on them, and `--service-account NAME` and
//! `--service-account-namespace NS`.
//!
//! ```
//! use kactor::cli::{OperatorCli, Scope};
//!
//! let cli = OperatorCli::parse_from(["my-operator", "-n", "team-a", "-n", "team-b,!team-b-tmp"])?;
//! assert_eq!(
//!     cli.run_args().scope(),
//!     Scope::Namespaces(vec!["team-a".into(), "team-b,!team-b-tmp".into()]),
//! );
//! # Ok::<(), clap::Error>(())
//! ```

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser};
use tracing::Level;

use crate::logging::{LogFormat, LogSettings};
pub use crate::scope::Scope;

/// The warning for an operator started with neither `--namespace` nor `--all-namespaces`, as Kopf's
/// `FutureWarning`.
const IMPLICIT_CLUSTER_WIDE: &str = "no --namespace or --all-namespaces given: serving the whole \
     cluster; pass -A to say so, or -n to restrict";

/// The default of `--log-refkey`.
const DEFAULT_REFKEY: &str = "object";

/// The options of `run`, the command that runs the operator (Kopf's `kopf run`).
///
/// Build it through clap, not by a struct literal, to stay compatible with options added later.
///
/// Two rules live in [`OperatorCli::parse_from`], not in clap's attributes (which would count values
/// from the environment as given on the command line): `-n` with `-A` is a usage error, and the later
/// of `--log-prefix`/`--no-log-prefix` wins. A program flattening `RunArgs` into its own parser gets
/// neither; [`scope`](Self::scope) and [`log_settings`](Self::log_settings) then let `-A` and
/// `--no-log-prefix` win.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct RunArgs {
    /// Serve only the namespaces that match; repeat for more.
    ///
    /// Each value is a pattern, or a comma-separated list of them: globs with `*` and `?`, and
    /// `!negations` (`-n 'team-*,!team-x'`). The first pattern decides; a leading negation means
    /// "all but". Cannot be combined with --all-namespaces.
    #[arg(
        short = 'n',
        long = "namespace",
        value_name = "NS",
        env = "KACTOR_NAMESPACE",
        action = ArgAction::Append,
    )]
    pub namespaces: Vec<String>,

    /// Serve all namespaces, with cluster-wide requests.
    ///
    /// The operator lists and watches its resources cluster-wide and needs ClusterRole permissions.
    /// Cannot be combined with --namespace.
    #[arg(
        short = 'A',
        long,
        env = "KACTOR_ALL_NAMESPACES",
        action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new(),
    )]
    pub all_namespaces: bool,

    /// Log DEBUG messages too, as --debug.
    #[arg(
        short,
        long,
        env = "KACTOR_VERBOSE",
        action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new(),
    )]
    pub verbose: bool,

    /// Log DEBUG messages too, as --verbose.
    ///
    /// Dependencies (hyper, kube's client, actix, ...) stay at WARN; set RUST_LOG (e.g.
    /// RUST_LOG=debug) to see them, or for any finer filter.
    #[arg(
        short,
        long,
        env = "KACTOR_DEBUG",
        action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new(),
    )]
    pub debug: bool,

    /// Log warnings and errors only.
    ///
    /// --verbose and --debug win over it, as in Kopf.
    #[arg(
        short,
        long,
        env = "KACTOR_QUIET",
        action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new(),
    )]
    pub quiet: bool,

    /// How log lines look.
    ///
    /// `full`: time, logger, level, message; `plain`: the message only; `json`: one JSON object per
    /// line, with the object's reference under --log-refkey.
    #[arg(
        long,
        value_name = "FORMAT",
        value_enum,
        env = "KACTOR_LOG_FORMAT",
        default_value_t = LogFormat::Full,
    )]
    pub log_format: LogFormat,

    /// The JSON key for the object a message is about.
    ///
    /// It holds `{apiVersion, kind, name, uid, namespace}`. Only the json format uses it.
    #[arg(
        long,
        value_name = "KEY",
        env = "KACTOR_LOG_REFKEY",
        default_value = DEFAULT_REFKEY
    )]
    pub log_refkey: String,

    /// Start messages about an object with `[namespace/name] `.
    ///
    /// The default is on for the full and plain formats and off for json, as in Kopf.
    #[arg(
        long,
        value_name = "BOOL",
        env = "KACTOR_LOG_PREFIX",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = BoolishValueParser::new(),
    )]
    pub log_prefix: Option<bool>,

    /// Do not start messages about an object with `[namespace/name] ` (as KACTOR_LOG_PREFIX=false).
    #[arg(long, action = ArgAction::SetTrue)]
    pub no_log_prefix: bool,

    /// Run alone: no peering with other operators (as Kopf's --standalone); it wins over --peering.
    ///
    /// Without it, the operator peers through the peering object `default` if its CRD is installed
    /// (and runs alone, with a warning, if not).
    #[arg(long, env = "KACTOR_STANDALONE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub standalone: bool,

    /// Peer through this peering object, and stay paused while it (or its CRD) is missing.
    ///
    /// A `ClusterKopfPeering` for cluster-wide operators, a `KopfPeering` in each served namespace
    /// otherwise (`kactor peering crds` prints the CRDs). Operators in the same peering never work at
    /// once: the highest priority works, the others pause.
    #[arg(short = 'P', long, value_name = "NAME", env = "KACTOR_PEERING")]
    pub peering: Option<String>,

    /// With --peering: create the peering object when its CRD is served and the object is missing,
    /// instead of staying paused until someone creates it (Kopf's only behaviour).
    ///
    /// The object is created empty, as `kubectl apply` of Kopf's would; peers find it as if it had
    /// been there. `manifests --peering` sets it, since one `kubectl apply` cannot create an object
    /// of a CRD it creates in the same run.
    #[arg(long, env = "KACTOR_CREATE_PEERING", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub create_peering: bool,

    /// This operator's peering priority: a live peer with a higher one pauses it; an equal one pauses
    /// both (as in Kopf).
    #[arg(
        short = 'p',
        long,
        value_name = "N",
        env = "KACTOR_PRIORITY",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    pub priority: i64,

    /// Peering priority 666, to take over from deployed operators while developing (as Kopf's --dev).
    #[arg(long, env = "KACTOR_DEV", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub dev: bool,

    /// How many object threads run the objects' workers and handlers (the setting
    /// execution.object_threads; default: the CPUs the process may use, its cgroup's CPU limit
    /// included).
    ///
    /// Each object's handlers run on one of these threads, one single-threaded runtime each.
    /// 0: the workers run on the actors' thread and the handlers on the operator's multi-threaded
    /// runtime, as tasks (for handlers that call tokio's block_in_place).
    #[arg(long, value_name = "N", env = "KACTOR_OBJECT_THREADS")]
    pub object_threads: Option<usize>,

    /// Work only while holding a coordination.k8s.io/v1 Lease; wait as a warm standby otherwise.
    ///
    /// Leases last 15 s, are renewed every 2 s and lost if not renewed within 10 s, as with
    /// controller-runtime. A graceful exit releases the lease for the next instance.
    #[arg(long, env = "KACTOR_LEADER_ELECTION", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub leader_election: bool,

    /// The Lease's name (default: the program's name); only with --leader-election.
    #[arg(long, value_name = "NAME", env = "KACTOR_LEASE_NAME")]
    pub lease_name: Option<String>,

    /// The Lease's namespace (default: POD_NAMESPACE, else `default`); only with --leader-election.
    #[arg(long, value_name = "NS", env = "KACTOR_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// Share the objects with the other replicas of this operator: `auto` (the ring is the lease's
    /// name, by default the program's name) or a ring name.
    ///
    /// Each replica keeps a Lease of its own (`<ring>-<pod>` in the lease namespace) and handles only
    /// the objects labelled `shard.kactor.dev/<ring>=<pod>`; the leader Lease's holder assigns them and
    /// moves them as replicas come and go. Not with --leader-election.
    #[arg(long, value_name = "RING", env = "KACTOR_SHARDS")]
    pub shards: Option<String>,

    /// Serve health and metrics at this URL, as Kopf's --liveness: e.g. http://0.0.0.0:8080/healthz.
    ///
    /// The path answers the liveness probe (Kopf's JSON of `on_probe` results; 500 and the failed
    /// checks when a watch stream went deaf, the actors' thread or the runtime is stuck, or a probe
    /// fails); the same server answers /healthz, /readyz (ready once startup handlers succeeded and
    /// every watch stream listed) and /metrics (Prometheus). Off by default; http only; the host
    /// defaults to localhost and the port to 80. Use 0.0.0.0 in a pod.
    #[arg(short = 'L', long, value_name = "URL", env = "KACTOR_LIVENESS")]
    pub liveness: Option<String>,

    /// Run on kactor's embedded, in-memory Kubernetes API server instead of a cluster, to try the
    /// operator without one.
    ///
    /// It installs the operator's own CRDs, writes a kubeconfig for kubectl, serves health and
    /// metrics (at --liveness, or on a free local port), prints where all of it is, and runs alone
    /// until Ctrl-C. Nothing is kept after the exit, unless --emulator-state says where. The server
    /// runs no controllers: a Deployment makes no pods.
    #[arg(long, env = "KACTOR_EMULATOR", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub emulator: bool,

    /// With --emulator: keep what was created in this file, and find it again at the next start.
    ///
    /// Restored at start (a file that is not a saved state is an error, and is left as it is),
    /// written every second while something changes, and at exit.
    #[arg(
        long,
        value_name = "FILE",
        env = "KACTOR_EMULATOR_STATE",
        requires = "emulator"
    )]
    pub emulator_state: Option<PathBuf>,
}

impl RunArgs {
    /// The namespaces to serve: [`Scope::Namespaces`] with `-n`, else [`Scope::ClusterWide`].
    ///
    /// [`OperatorCli::parse_from`] rejects `-n` with `-A`; a `RunArgs` parsed otherwise with both is
    /// cluster-wide.
    pub fn scope(&self) -> Scope {
        if self.all_namespaces || self.namespaces.is_empty() {
            Scope::ClusterWide
        } else {
            Scope::Namespaces(self.namespaces.clone())
        }
    }

    /// The Lease's name: `--lease-name`, else the program's name (what `rbac generate` grants too).
    pub(crate) fn lease_name_or_default(&self) -> String {
        self.lease_name
            .clone()
            .or_else(program_name)
            .unwrap_or_else(|| DEFAULT_NAME.to_string())
    }

    /// The Leases' namespace: `--lease-namespace`, else `POD_NAMESPACE`, else `default`.
    pub(crate) fn lease_namespace_or_default(&self) -> String {
        self.lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".to_string())
    }

    /// With `--shards`: the ring's name (`auto`: the Lease's name).
    pub(crate) fn ring(&self) -> Option<String> {
        self.shards.as_deref().map(|ring| match ring {
            "auto" => self.lease_name_or_default(),
            ring => ring.to_string(),
        })
    }

    /// The warning to log at startup when the scope is cluster-wide only because neither `-n` nor `-A`
    /// was given (as Kopf's `FutureWarning`); `None` when the scope was chosen explicitly.
    pub fn scope_warning(&self) -> Option<&'static str> {
        (!self.all_namespaces && self.namespaces.is_empty()).then_some(IMPLICIT_CLUSTER_WIDE)
    }

    /// These options as a command line for `run` (without the program's name), the inverse of
    /// parsing: only what differs from the defaults, so that parsing it gives these options back.
    /// `manifests` writes the Deployment's `args` with it. `--emulator` and `--emulator-state` are
    /// left out (a Deployment runs on its cluster).
    ///
    /// ```
    /// use kactor::cli::OperatorCli;
    ///
    /// let cli = OperatorCli::parse_from(["op", "-A", "--peering", "ops", "--log-format", "json"])?;
    /// assert_eq!(cli.run_args().to_args(), ["--all-namespaces", "--log-format=json", "--peering=ops"]);
    /// # Ok::<(), clap::Error>(())
    /// ```
    pub fn to_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if self.all_namespaces {
            args.push("--all-namespaces".to_string());
        }
        for namespace in &self.namespaces {
            args.push(format!("--namespace={namespace}"));
        }
        for (on, flag) in [
            (self.verbose, "--verbose"),
            (self.debug, "--debug"),
            (self.quiet, "--quiet"),
        ] {
            if on {
                args.push(flag.to_string());
            }
        }
        if self.log_format != LogFormat::default() {
            args.push(format!("--log-format={}", self.log_format));
        }
        if self.log_refkey != DEFAULT_REFKEY {
            args.push(format!("--log-refkey={}", self.log_refkey));
        }
        if self.no_log_prefix {
            args.push("--no-log-prefix".to_string());
        } else if let Some(prefix) = self.log_prefix {
            args.push(format!("--log-prefix={prefix}"));
        }
        if self.standalone {
            args.push("--standalone".to_string());
        }
        if let Some(name) = &self.peering {
            args.push(format!("--peering={name}"));
        }
        if self.create_peering {
            args.push("--create-peering".to_string());
        }
        if self.priority != 0 {
            args.push(format!("--priority={}", self.priority));
        }
        if self.dev {
            args.push("--dev".to_string());
        }
        if let Some(threads) = self.object_threads {
            args.push(format!("--object-threads={threads}"));
        }
        if self.leader_election {
            args.push("--leader-election".to_string());
        }
        if let Some(name) = &self.lease_name {
            args.push(format!("--lease-name={name}"));
        }
        if let Some(namespace) = &self.lease_namespace {
            args.push(format!("--lease-namespace={namespace}"));
        }
        if let Some(ring) = &self.shards {
            args.push(format!("--shards={ring}"));
        }
        if let Some(url) = &self.liveness {
            args.push(format!("--liveness={url}"));
        }
        args
    }

    /// The log settings these options give, for [`crate::logging::init`]: DEBUG with `-v` or `-d`,
    /// else WARN with `-q`, else INFO; the prefix as `--log-prefix`/`--no-log-prefix` say, else on for
    /// the text formats and off for json.
    pub fn log_settings(&self) -> LogSettings {
        let level = if self.verbose || self.debug {
            Level::DEBUG
        } else if self.quiet {
            Level::WARN
        } else {
            Level::INFO
        };
        let prefix = if self.no_log_prefix {
            false
        } else {
            self.log_prefix
                .unwrap_or_else(|| self.log_format.default_prefix())
        };
        LogSettings {
            level,
            format: self.log_format,
            refkey: self.log_refkey.clone(),
            prefix,
        }
    }
}

/// The command line of an operator: `run` (the default) and its [`RunArgs`], `rbac generate`,
/// `rbac verify`, `crds`, `manifests` and `olm bundle` ([`Manifests`]), `--help` and `--version`.
///
/// `run` is implied: `my-operator -n ns1` is `my-operator run -n ns1`. Options given before a command
/// are a usage error (`my-operator -v run`), so that there is one place for them.
///
/// `--version` prints kactor's version.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(
    version,
    about = "A Kubernetes operator, made with kactor",
    long_about = None,
    args_conflicts_with_subcommands = true,
    disable_help_subcommand = true
)]
pub struct OperatorCli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

/// What the command line asks for.
#[derive(clap::Subcommand, Debug, Clone, PartialEq)]
pub enum Command {
    /// Run the operator (the default command).
    Run(RunArgs),
    /// `rbac generate`, `rbac verify`, `crds`, `manifests`, `olm bundle`: the manifests that deploy
    /// the operator.
    #[command(flatten)]
    Manifests(Manifests),
}

/// The commands about what an operator needs in a cluster: its RBAC, its CRDs, everything for one
/// apply, an OLM bundle. They print, check or write manifests and exit; [`Manifests::execute`]
/// carries them out.
// Parsed once per process: boxing `Rbac` would save nothing worth the clumsier matching.
#[allow(clippy::large_enum_variant)]
#[derive(clap::Subcommand, Debug, Clone, PartialEq)]
pub enum Manifests {
    /// The RBAC this operator needs: print it, or check manifests for it.
    #[command(subcommand)]
    Rbac(RbacCommand),
    /// Print the CRDs of the resources this operator owns, as YAML (`my-operator crds | kubectl
    /// apply -f -`).
    Crds,
    /// Print everything this operator needs in a cluster, in the order a cluster accepts it, for one
    /// `kubectl apply --server-side -f -`.
    ///
    /// Its namespace; its CRDs (and the peering CRDs with --peering); its RBAC, as `rbac generate`
    /// derives it; a Deployment running the image with these options, probed on /healthz and
    /// /readyz; a Service for /metrics. Give it the options the operator runs with (those of `run`):
    /// they become the Deployment's arguments. With --peering, the operator creates its peering object
    /// (--create-peering), since one apply cannot create an object of a CRD it creates.
    #[command(name = "manifests")]
    All(DeployArgs),
    /// Operator Lifecycle Manager: write this operator as an OLM bundle.
    #[command(subcommand)]
    Olm(OlmCommand),
}

/// `olm bundle`.
#[derive(clap::Subcommand, Debug, Clone, PartialEq)]
pub enum OlmCommand {
    /// Write an Operator Lifecycle Manager bundle (registry+v1, as `operator-sdk generate bundle`):
    /// a ClusterServiceVersion and the CRDs in DIR/manifests, DIR/metadata/annotations.yaml, and
    /// DIR/bundle.Dockerfile.
    ///
    /// The CSV deploys the operator as `manifests` would (the same Deployment, with these options as
    /// its arguments), with the RBAC `rbac generate` derives as its permissions (namespaced rules)
    /// and clusterPermissions (cluster-wide rules), and owns the CRDs declared with Operator::crd.
    /// Its install modes follow the scope: with -A (or no -n), AllNamespaces; with -n, OwnNamespace,
    /// SingleNamespace and MultiNamespace, and the operator serves the namespaces of its
    /// OperatorGroup (OLM's olm.targetNamespaces annotation), not those given to -n.
    /// Build the bundle image with `docker build -f DIR/bundle.Dockerfile DIR`.
    // Boxed: its many options would make every `Manifests` (and the programs' own enums holding
    // one) as large.
    Bundle(Box<BundleArgs>),
}

/// The options of `olm bundle`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct BundleArgs {
    /// The operator's container image (e.g. `registry.example.com/my-operator:1.0`).
    #[arg(long, value_name = "IMAGE", env = "KACTOR_IMAGE")]
    pub image: String,
    /// The bundle's version, a semantic version (`1.2.3`): the CSV is `PACKAGE.vVERSION`.
    #[arg(long, value_name = "VERSION")]
    pub version: String,
    /// The OLM package (default: the operator's name, --name).
    #[arg(long, value_name = "NAME")]
    pub package: Option<String>,
    /// The channels the bundle is in, comma-separated.
    #[arg(
        long,
        value_name = "CHANNELS",
        value_delimiter = ',',
        default_value = "alpha"
    )]
    pub channels: Vec<String>,
    /// The package's default channel (default: the first of --channels).
    #[arg(long, value_name = "CHANNEL")]
    pub default_channel: Option<String>,
    /// The CSV's display name (default: the package's name in words, `My Operator`).
    #[arg(long, value_name = "TEXT")]
    pub display_name: Option<String>,
    /// The CSV's description (default: one line naming the operator).
    #[arg(long, value_name = "TEXT")]
    pub description: Option<String>,
    /// The oldest Kubernetes the operator runs on, a semantic version (`1.28.0`): the CSV's
    /// minKubeVersion.
    #[arg(long, value_name = "VERSION")]
    pub min_kube_version: Option<String>,
    /// The name of the Deployment and its service account (default: the program's name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// How many replicas: more than one needs --peering or --leader-election (the others wait as
    /// standbys), or --shards (they share the objects).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub replicas: u32,
    /// The directory to write the bundle into (created if missing; files of the same names are
    /// replaced).
    #[arg(long, value_name = "DIR", default_value = "bundle")]
    pub output_dir: PathBuf,
    /// The options the operator runs with. `--liveness` defaults to http://0.0.0.0:8080/healthz here.
    #[command(flatten)]
    pub run: RunArgs,
}

impl BundleArgs {
    /// The name of the Deployment and its service account: `--name`, else the program's name, else
    /// `kactor-operator`.
    pub fn name(&self) -> String {
        self.name
            .clone()
            .or_else(program_name)
            .unwrap_or_else(|| DEFAULT_NAME.to_string())
    }

    /// The OLM package: `--package`, else the operator's [`name`](Self::name).
    pub fn package(&self) -> String {
        self.package.clone().unwrap_or_else(|| self.name())
    }

    /// The default channel: `--default-channel`, else the first of `--channels`.
    pub fn default_channel(&self) -> String {
        self.default_channel
            .clone()
            .or_else(|| self.channels.first().cloned())
            .unwrap_or_default()
    }
}

/// The options of `manifests`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct DeployArgs {
    /// The operator's container image (e.g. `registry.example.com/my-operator:1.0`).
    #[arg(long, value_name = "IMAGE", env = "KACTOR_IMAGE")]
    pub image: String,
    /// The name of the Deployment, its service account, roles and Service (default: the program's
    /// name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// The namespace the operator runs in, created first (default: its name). `--namespace` is the
    /// namespaces it serves, as for `run`.
    #[arg(long, value_name = "NS")]
    pub operator_namespace: Option<String>,
    /// How many replicas: more than one needs --peering or --leader-election (the others wait as
    /// standbys), or --shards (they share the objects).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub replicas: u32,
    /// Write the manifests to this file instead of stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The options the operator runs with. `--liveness` defaults to http://0.0.0.0:8080/healthz here.
    #[command(flatten)]
    pub run: RunArgs,
}

impl DeployArgs {
    /// The name of the Deployment and of everything named after it: `--name`, else the program's
    /// name, else `kactor-operator`.
    pub fn name(&self) -> String {
        self.name
            .clone()
            .or_else(program_name)
            .unwrap_or_else(|| DEFAULT_NAME.to_string())
    }

    /// The namespace the operator runs in: `--operator-namespace`, else its [`name`](Self::name).
    pub fn operator_namespace(&self) -> String {
        self.operator_namespace
            .clone()
            .unwrap_or_else(|| self.name())
    }
}

/// `rbac generate` and `rbac verify`.
#[derive(clap::Subcommand, Debug, Clone, PartialEq)]
pub enum RbacCommand {
    /// Print the ServiceAccount, ClusterRole, Roles and bindings this operator needs, as YAML.
    ///
    /// They are derived from the registered handlers (their resources), the scope (-A: a
    /// ClusterRole; -n NS: a Role in each namespace, and a ClusterRole for what is cluster-wide),
    /// peering and leader election, with a comment on each rule saying why it is needed. Give it the
    /// options the operator runs with. Resources named only by kind or short name are resolved
    /// through the cluster (credentials as for `run`).
    Generate(GenerateArgs),
    /// Check RBAC manifests: print each permission this operator needs as present or missing.
    ///
    /// Reads Roles, ClusterRoles, RoleBindings and ClusterRoleBindings (other documents are ignored;
    /// `kubectl get ... -o yaml` lists are read too) and counts only the rules bound to the
    /// operator's service account. Exits with status 1 when a permission is missing.
    Verify(VerifyArgs),
}

/// The options of `rbac generate`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct GenerateArgs {
    /// Write the manifests to this file instead of stdout.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Who the operator runs as, and with which options.
    #[command(flatten)]
    pub rbac: RbacArgs,
}

/// The options of `rbac verify`.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct VerifyArgs {
    /// Read the manifests from this file; `-` or none: from stdin.
    #[arg(
        short = 'f',
        long = "filename",
        visible_alias = "file",
        value_name = "FILE"
    )]
    pub file: Option<PathBuf>,
    /// Who the operator runs as, and with which options.
    #[command(flatten)]
    pub rbac: RbacArgs,
}

/// What the operator's permissions depend on: the options it runs with (those of `run`), and the
/// service account it runs as.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct RbacArgs {
    /// The service account the operator runs as (default: the program's name).
    #[arg(long, value_name = "NAME", env = "KACTOR_SERVICE_ACCOUNT")]
    pub service_account: Option<String>,
    /// The service account's namespace (default: POD_NAMESPACE, else `default`).
    #[arg(long, value_name = "NS", env = "KACTOR_SERVICE_ACCOUNT_NAMESPACE")]
    pub service_account_namespace: Option<String>,
    /// The options the operator runs with.
    #[command(flatten)]
    pub run: RunArgs,
}

impl RbacArgs {
    /// The service account's name: `--service-account`, else the program's name, else
    /// `kactor-operator`.
    pub fn service_account_name(&self) -> String {
        self.service_account
            .clone()
            .or_else(program_name)
            .unwrap_or_else(|| DEFAULT_NAME.to_string())
    }

    /// The service account's namespace: `--service-account-namespace`, else `POD_NAMESPACE`, else
    /// `default`.
    pub fn service_account_namespace(&self) -> String {
        self.service_account_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "default".to_string())
    }
}

/// The name of an operator whose program has no name.
pub(crate) const DEFAULT_NAME: &str = "kactor-operator";

/// The running program's name, without directories and extension (`my-operator`).
pub(crate) fn program_name() -> Option<String> {
    std::env::args_os().next().and_then(|program| {
        std::path::Path::new(&program)
            .file_stem()
            .map(|stem| kubernetes_name(&stem.to_string_lossy()))
            .filter(|name| !name.is_empty())
    })
}

/// `name` as a Kubernetes object name (DNS-1123: lowercase letters, digits, `-`, `.`; alphanumeric
/// at both ends): `ephemeral_volume_claims` becomes `ephemeral-volume-claims`.
pub(crate) fn kubernetes_name(name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '-' | '.') => c,
            _ => '-',
        })
        .collect();
    name.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(253)
        .collect()
}

impl OperatorCli {
    /// Parses a command line, the program's name first (as [`std::env::args_os`] gives it).
    ///
    /// `--help`, `--version` and usage errors are returned as a [`clap::Error`]; its
    /// [`exit`](clap::Error::exit) prints them and exits with the right code (0 for help and version,
    /// 2 for usage errors).
    ///
    /// ```no_run
    /// use kactor::cli::OperatorCli;
    ///
    /// let cli = match OperatorCli::parse_from(std::env::args_os()) {
    ///     Ok(cli) => cli,
    ///     Err(error) => error.exit(),
    /// };
    /// ```
    pub fn parse_from<I, T>(args: I) -> Result<OperatorCli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut command = <OperatorCli as CommandFactory>::command();
        let matches = command.try_get_matches_from_mut(args)?;
        let mut cli = <OperatorCli as FromArgMatches>::from_arg_matches(&matches)
            .map_err(|error| error.format(&mut command))?;
        // The options of `run` are in the innermost command's matches (`rbac generate` flattens them).
        let mut run_matches = &matches;
        while let Some((_, sub)) = run_matches.subcommand() {
            run_matches = sub;
        }
        let run = match &mut cli.command {
            None => &mut cli.run,
            Some(Command::Run(args)) => args,
            Some(Command::Manifests(Manifests::Rbac(RbacCommand::Generate(args)))) => {
                &mut args.rbac.run
            }
            Some(Command::Manifests(Manifests::Rbac(RbacCommand::Verify(args)))) => {
                &mut args.rbac.run
            }
            Some(Command::Manifests(Manifests::All(args))) => &mut args.run,
            Some(Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args)))) => &mut args.run,
            Some(Command::Manifests(Manifests::Crds)) => return Ok(cli),
        };
        // The checks below are not clap's `conflicts_with`/`overrides_with`, because clap counts values
        // from the environment as given: `KACTOR_ALL_NAMESPACES=false -n ns1` would be a conflict, and
        // `KACTOR_LOG_PREFIX=true --no-log-prefix` too.
        if run.all_namespaces && !run.namespaces.is_empty() {
            return Err(command.error(
                ErrorKind::ArgumentConflict,
                "--namespace and --all-namespaces cannot be used together (KACTOR_NAMESPACE and \
                 KACTOR_ALL_NAMESPACES=true count too): use -n to serve some namespaces, or -A to \
                 serve all of them",
            ));
        }
        resolve_log_prefix(run, run_matches);
        Ok(cli)
    }

    /// What the command line asks for; `run` when no command was written.
    pub fn command(&self) -> Command {
        match &self.command {
            Some(command) => command.clone(),
            None => Command::Run(self.run.clone()),
        }
    }

    /// The options of `run`, whether `run` was written or implied; for `rbac generate`,
    /// `rbac verify`, `manifests` and `olm bundle`, the options they were given (those the operator
    /// runs with); for `crds`, the defaults (and `KACTOR_...` variables).
    pub fn run_args(&self) -> &RunArgs {
        match &self.command {
            Some(Command::Run(args)) => args,
            Some(Command::Manifests(Manifests::Rbac(RbacCommand::Generate(args)))) => {
                &args.rbac.run
            }
            Some(Command::Manifests(Manifests::Rbac(RbacCommand::Verify(args)))) => &args.rbac.run,
            Some(Command::Manifests(Manifests::All(args))) => &args.run,
            Some(Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args)))) => &args.run,
            Some(Command::Manifests(Manifests::Crds)) | None => &self.run,
        }
    }

    /// The options of `run`, by value (see [`run_args`](Self::run_args)).
    pub fn into_run_args(self) -> RunArgs {
        match self.command {
            Some(Command::Run(args)) => args,
            Some(Command::Manifests(Manifests::Rbac(RbacCommand::Generate(args)))) => args.rbac.run,
            Some(Command::Manifests(Manifests::Rbac(RbacCommand::Verify(args)))) => args.rbac.run,
            Some(Command::Manifests(Manifests::All(args))) => args.run,
            Some(Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args)))) => args.run,
            Some(Command::Manifests(Manifests::Crds)) | None => self.run,
        }
    }
}

/// Makes the later of `--log-prefix` and `--no-log-prefix` win, and either of them win over
/// `KACTOR_LOG_PREFIX`.
fn resolve_log_prefix(run: &mut RunArgs, matches: &ArgMatches) {
    if !run.no_log_prefix || run.log_prefix.is_none() {
        return;
    }
    let given = matches.value_source("log_prefix") == Some(ValueSource::CommandLine);
    if given && matches.index_of("log_prefix") > matches.index_of("no_log_prefix") {
        run.no_log_prefix = false;
    } else {
        run.log_prefix = None;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn program_names_become_kubernetes_names() {
        assert_eq!(
            kubernetes_name("ephemeral_volume_claims"),
            "ephemeral-volume-claims"
        );
        assert_eq!(kubernetes_name("My.Operator"), "my.operator");
        assert_eq!(kubernetes_name("_op_"), "op");
        assert_eq!(kubernetes_name("__"), "");
    }

    /// Serialises the tests that read or write the `KACTOR_*` environment variables, which the test
    /// threads share.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    thread_local! {
        /// Whether this thread holds [`ENV`] (inside [`with_env`]).
        static HOLDS_ENV: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    fn lock_env() -> std::sync::MutexGuard<'static, ()> {
        ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Parses `my-operator ARGS...`, never while another test changes the environment.
    pub(crate) fn cli(args: &[&str]) -> Result<OperatorCli, clap::Error> {
        let mut argv = vec!["my-operator"];
        argv.extend_from_slice(args);
        if HOLDS_ENV.get() {
            OperatorCli::parse_from(argv)
        } else {
            let _guard = lock_env();
            OperatorCli::parse_from(argv)
        }
    }

    fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        cli(args).map(OperatorCli::into_run_args)
    }

    /// Runs `check` with these environment variables set.
    fn with_env(vars: &[(&str, &str)], check: impl FnOnce()) {
        let _guard = lock_env();
        HOLDS_ENV.set(true);
        for (name, value) in vars {
            std::env::set_var(name, value);
        }
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
        for (name, _) in vars {
            std::env::remove_var(name);
        }
        HOLDS_ENV.set(false);
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }

    #[test]
    fn no_options_is_cluster_wide_with_a_warning() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.scope(), Scope::ClusterWide);
        assert_eq!(
            args.scope_warning(),
            Some(
                "no --namespace or --all-namespaces given: serving the whole cluster; \
                 pass -A to say so, or -n to restrict"
            )
        );
    }

    #[test]
    fn all_namespaces_is_cluster_wide_without_a_warning() {
        for flag in ["-A", "--all-namespaces"] {
            let args = parse(&[flag]).unwrap();
            assert!(args.all_namespaces);
            assert_eq!(args.scope(), Scope::ClusterWide);
            assert_eq!(args.scope_warning(), None);
        }
    }

    #[test]
    fn namespaces_keep_one_pattern_per_option() {
        let args = parse(&["-n", "a", "--namespace", "b,!c", "--namespace=d*"]).unwrap();
        assert_eq!(
            args.scope(),
            Scope::Namespaces(vec!["a".into(), "b,!c".into(), "d*".into()])
        );
        assert_eq!(args.scope_warning(), None);
    }

    #[test]
    fn namespace_and_all_namespaces_is_a_usage_error() {
        let error = parse(&["-n", "x", "-A"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
        let error = parse(&["-A", "run"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
        let error = parse(&["run", "-A", "--namespace", "x"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn peering_options_parse_as_kopfs() {
        let args = parse(&["-P", "team", "-p", "-5"]).unwrap();
        assert_eq!(
            (
                args.peering.as_deref(),
                args.priority,
                args.standalone,
                args.dev
            ),
            (Some("team"), -5, false, false)
        );
        assert!(parse(&["--standalone"]).unwrap().standalone);
        assert!(parse(&["--dev"]).unwrap().dev);
        assert_eq!(parse(&[]).unwrap().priority, 0);
        with_env(
            &[("KACTOR_PEERING", "other"), ("KACTOR_PRIORITY", "100")],
            || {
                let args = parse(&[]).unwrap();
                assert_eq!(
                    (args.peering.as_deref(), args.priority),
                    (Some("other"), 100)
                );
            },
        );
    }

    #[test]
    fn leader_election_options_parse() {
        let args = parse(&[
            "--leader-election",
            "--lease-name",
            "my-op",
            "--lease-namespace",
            "ops",
        ])
        .unwrap();
        assert!(args.leader_election);
        assert_eq!(
            (args.lease_name.as_deref(), args.lease_namespace.as_deref()),
            (Some("my-op"), Some("ops"))
        );
        assert!(!parse(&[]).unwrap().leader_election);
    }

    #[test]
    fn run_is_the_default_command() {
        let implied = cli(&["-n", "ns1", "-v"]).unwrap();
        let explicit = cli(&["run", "-n", "ns1", "-v"]).unwrap();
        assert_eq!(implied.run_args(), explicit.run_args());
        assert_eq!(
            explicit.run_args().scope(),
            Scope::Namespaces(vec!["ns1".into()])
        );
        assert_eq!(implied.into_run_args(), explicit.into_run_args());
        assert_eq!(parse(&[]).unwrap(), parse(&["run"]).unwrap());
    }

    #[test]
    fn options_before_an_explicit_run_are_a_usage_error() {
        assert!(parse(&["-v", "run"]).is_err());
    }

    #[test]
    fn log_level_is_info_by_default() {
        assert_eq!(parse(&[]).unwrap().log_settings().level, Level::INFO);
    }

    #[test]
    fn verbose_and_debug_give_debug() {
        for flag in ["-v", "--verbose", "-d", "--debug"] {
            assert_eq!(
                parse(&[flag]).unwrap().log_settings().level,
                Level::DEBUG,
                "{flag}"
            );
        }
    }

    #[test]
    fn quiet_gives_warn_unless_verbose() {
        for flag in ["-q", "--quiet"] {
            assert_eq!(parse(&[flag]).unwrap().log_settings().level, Level::WARN);
        }
        assert_eq!(
            parse(&["-q", "-v"]).unwrap().log_settings().level,
            Level::DEBUG
        );
        assert_eq!(
            parse(&["-d", "-q"]).unwrap().log_settings().level,
            Level::DEBUG
        );
    }

    #[test]
    fn log_format_defaults_to_full_with_prefix_and_object_refkey() {
        let settings = parse(&[]).unwrap().log_settings();
        assert_eq!(
            settings,
            LogSettings {
                level: Level::INFO,
                format: LogFormat::Full,
                refkey: "object".into(),
                prefix: true,
            }
        );
    }

    #[test]
    fn log_format_json_has_no_prefix_by_default() {
        let settings = parse(&["--log-format", "json"]).unwrap().log_settings();
        assert_eq!(settings.format, LogFormat::Json);
        assert!(!settings.prefix);
        let settings = parse(&["--log-format=plain"]).unwrap().log_settings();
        assert_eq!(settings.format, LogFormat::Plain);
        assert!(settings.prefix);
    }

    #[test]
    fn unknown_log_format_is_a_usage_error() {
        let error = parse(&["--log-format", "xml"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidValue);
    }

    #[test]
    fn log_refkey_is_taken() {
        let settings = parse(&["--log-refkey", "k8s_obj"]).unwrap().log_settings();
        assert_eq!(settings.refkey, "k8s_obj");
    }

    #[test]
    fn log_prefix_flags_override_the_format_default_and_each_other() {
        let prefix = |args: &[&str]| parse(args).unwrap().log_settings().prefix;
        assert!(prefix(&["--log-format", "json", "--log-prefix"]));
        assert!(!prefix(&["--no-log-prefix"]));
        assert!(!prefix(&["--log-prefix=false"]));
        assert!(prefix(&["--no-log-prefix", "--log-prefix"]));
        assert!(!prefix(&["--log-prefix", "--no-log-prefix"]));
    }

    /// `to_args` is parsing's inverse: what it writes parses back to the same options.
    #[test]
    fn run_options_written_as_a_command_line_parse_back_to_themselves() {
        for line in [
            &[][..],
            &["-A"],
            &["-n", "team-*,!team-x", "-n", "ops"],
            &[
                "-v",
                "-q",
                "--log-format",
                "json",
                "--log-refkey",
                "k8s",
                "--log-prefix",
            ],
            &["--log-prefix=false"],
            &["--no-log-prefix", "--log-format=plain"],
            &["--standalone", "-p", "-5", "--dev"],
            &["-P", "ops", "--create-peering", "-d"],
            &[
                "-A",
                "--leader-election",
                "--lease-name",
                "l",
                "--lease-namespace",
                "ns",
            ],
            &["-L", "http://0.0.0.0:8080/healthz"],
            &["--object-threads", "0"],
            &["--object-threads=4", "-A"],
        ] {
            let args = parse(line).unwrap();
            let written = args.to_args();
            let mut again: Vec<&str> = vec!["run"];
            again.extend(written.iter().map(String::as_str));
            assert_eq!(
                parse(&again).unwrap(),
                args,
                "{line:?} written as {written:?}"
            );
        }
        // Only what differs from the defaults, and never --emulator.
        assert!(parse(&["--emulator"]).unwrap().to_args().is_empty());
    }

    #[test]
    fn manifests_takes_the_image_its_own_options_and_those_of_run() {
        let parsed = cli(&[
            "manifests",
            "--image",
            "op:1",
            "--operator-namespace",
            "ops",
            "--replicas",
            "2",
            "-n",
            "team-a",
            "--leader-election",
        ])
        .unwrap();
        let Command::Manifests(Manifests::All(args)) = parsed.command() else {
            panic!("{parsed:?}")
        };
        assert_eq!(args.image, "op:1");
        assert_eq!(args.operator_namespace(), "ops");
        assert_eq!(args.replicas, 2);
        assert_eq!(args.run.scope(), Scope::Namespaces(vec!["team-a".into()]));
        assert!(args.run.leader_election);
        assert_eq!(parsed.run_args(), &args.run);
        // The image is required; the operator's namespace defaults to its name.
        assert!(cli_error_kind(&["manifests", "-A"]) == ErrorKind::MissingRequiredArgument);
        let parsed = cli(&["manifests", "--image", "op:1", "--name", "my-op"]).unwrap();
        let Command::Manifests(Manifests::All(args)) = parsed.command() else {
            panic!("{parsed:?}")
        };
        assert_eq!(
            (args.name(), args.operator_namespace()),
            ("my-op".into(), "my-op".into())
        );
        // -n with -A is a usage error here too.
        assert!(
            cli_error_kind(&["manifests", "--image", "x", "-A", "-n", "a"])
                == ErrorKind::ArgumentConflict
        );
    }

    #[test]
    fn olm_bundle_takes_the_bundles_options_and_those_of_run() {
        let parsed = cli(&[
            "olm",
            "bundle",
            "--image",
            "op:1",
            "--version",
            "1.2.3",
            "--channels",
            "alpha,stable",
            "--default-channel",
            "stable",
            "--package",
            "widgets",
            "--output-dir",
            "out",
            "-n",
            "team-a",
            "--leader-election",
        ])
        .unwrap();
        let Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args))) = parsed.command() else {
            panic!("{parsed:?}")
        };
        assert_eq!(
            (args.image.as_str(), args.version.as_str()),
            ("op:1", "1.2.3")
        );
        assert_eq!(args.channels, ["alpha", "stable"]);
        assert_eq!(args.default_channel(), "stable");
        assert_eq!(args.package(), "widgets");
        assert_eq!(args.output_dir, PathBuf::from("out"));
        assert_eq!(args.run.scope(), Scope::Namespaces(vec!["team-a".into()]));
        assert!(args.run.leader_election);
        assert_eq!(parsed.run_args(), &args.run);
        // The defaults: the package is the operator's name, one channel `alpha`, the directory `bundle`.
        let parsed = cli(&[
            "olm",
            "bundle",
            "--image",
            "x",
            "--version",
            "1.0.0",
            "--name",
            "my-op",
        ])
        .unwrap();
        let Command::Manifests(Manifests::Olm(OlmCommand::Bundle(args))) = parsed.command() else {
            panic!("{parsed:?}")
        };
        assert_eq!(
            (args.package(), args.default_channel()),
            ("my-op".into(), "alpha".into())
        );
        assert_eq!(args.channels, ["alpha"]);
        assert_eq!(args.output_dir, PathBuf::from("bundle"));
        // The image and the version are required; -n with -A is a usage error here too.
        for missing in [
            &["olm", "bundle", "--image", "x"][..],
            &["olm", "bundle", "--version", "1.0.0"],
        ] {
            assert_eq!(cli_error_kind(missing), ErrorKind::MissingRequiredArgument);
        }
        assert_eq!(
            cli_error_kind(&[
                "olm",
                "bundle",
                "--image",
                "x",
                "--version",
                "1.0.0",
                "-A",
                "-n",
                "a"
            ]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            cli_error_kind(&["olm"]),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        let help = cli(&["olm", "bundle", "--help"])
            .unwrap_err()
            .render()
            .to_string();
        for needle in [
            "--version <VERSION>",
            "--channels <CHANNELS>",
            "--output-dir <DIR>",
            "olm.targetNamespaces",
        ] {
            assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
        }
    }

    fn cli_error_kind(args: &[&str]) -> ErrorKind {
        cli(args).unwrap_err().kind()
    }

    #[test]
    fn every_option_reads_its_environment_variable() {
        with_env(
            &[
                ("KACTOR_NAMESPACE", "team-*,!team-x"),
                ("KACTOR_VERBOSE", "true"),
                ("KACTOR_LOG_FORMAT", "json"),
                ("KACTOR_LOG_REFKEY", "k8s_obj"),
                ("KACTOR_LOG_PREFIX", "yes"),
            ],
            || {
                let args = parse(&[]).unwrap();
                assert_eq!(
                    args.scope(),
                    Scope::Namespaces(vec!["team-*,!team-x".into()])
                );
                assert_eq!(
                    args.log_settings(),
                    LogSettings {
                        level: Level::DEBUG,
                        format: LogFormat::Json,
                        refkey: "k8s_obj".into(),
                        prefix: true,
                    }
                );
                // The same through an explicit `run`.
                assert_eq!(parse(&["run"]).unwrap(), args);
            },
        );
        with_env(
            &[
                ("KACTOR_ALL_NAMESPACES", "1"),
                ("KACTOR_QUIET", "true"),
                ("KACTOR_LOG_PREFIX", "false"),
            ],
            || {
                let args = parse(&[]).unwrap();
                assert_eq!(args.scope(), Scope::ClusterWide);
                assert_eq!(args.scope_warning(), None);
                assert_eq!(args.log_settings().level, Level::WARN);
                assert!(!args.log_settings().prefix);
            },
        );
        with_env(&[("KACTOR_DEBUG", "on")], || {
            assert_eq!(parse(&[]).unwrap().log_settings().level, Level::DEBUG);
        });
    }

    #[test]
    fn false_environment_flags_are_off() {
        with_env(
            &[
                ("KACTOR_ALL_NAMESPACES", "false"),
                ("KACTOR_VERBOSE", "no"),
                ("KACTOR_QUIET", "0"),
            ],
            || {
                let args = parse(&["-n", "ns1"]).unwrap();
                assert!(!args.all_namespaces);
                assert_eq!(args.scope(), Scope::Namespaces(vec!["ns1".into()]));
                assert_eq!(args.log_settings().level, Level::INFO);
            },
        );
    }

    #[test]
    fn command_line_wins_over_the_environment() {
        with_env(
            &[
                ("KACTOR_NAMESPACE", "from-env"),
                ("KACTOR_LOG_FORMAT", "json"),
                ("KACTOR_LOG_PREFIX", "true"),
            ],
            || {
                let args =
                    parse(&["-n", "from-cli", "--log-format", "plain", "--no-log-prefix"]).unwrap();
                assert_eq!(args.scope(), Scope::Namespaces(vec!["from-cli".into()]));
                assert_eq!(args.log_settings().format, LogFormat::Plain);
                assert!(!args.log_settings().prefix);
            },
        );
    }

    #[test]
    fn namespace_from_the_environment_and_all_namespaces_is_a_usage_error() {
        with_env(&[("KACTOR_NAMESPACE", "ns1")], || {
            let error = parse(&["-A"]).unwrap_err();
            assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
            assert!(error
                .to_string()
                .contains("--namespace and --all-namespaces cannot be used together"));
        });
    }

    #[test]
    fn log_prefix_on_the_command_line_wins_over_the_environment() {
        with_env(&[("KACTOR_LOG_PREFIX", "false")], || {
            assert!(parse(&["--log-prefix"]).unwrap().log_settings().prefix);
            assert!(!parse(&[]).unwrap().log_settings().prefix);
        });
        with_env(&[("KACTOR_LOG_PREFIX", "true")], || {
            let args = parse(&["--log-format", "json", "--no-log-prefix"]).unwrap();
            assert!(!args.log_settings().prefix);
            assert!(
                parse(&["--log-format", "json"])
                    .unwrap()
                    .log_settings()
                    .prefix
            );
        });
    }

    #[test]
    fn help_explains_every_option() {
        let error = parse(&["--help"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::DisplayHelp);
        let help = error.render().to_string();
        for needle in [
            "-n, --namespace <NS>",
            "KACTOR_NAMESPACE",
            "-A, --all-namespaces",
            "KACTOR_ALL_NAMESPACES",
            "-v, --verbose",
            "-d, --debug",
            "-q, --quiet",
            "--log-format <FORMAT>",
            "KACTOR_LOG_FORMAT",
            "--log-refkey <KEY>",
            "--log-prefix",
            "--no-log-prefix",
            "Serve only the namespaces that match",
            "one JSON object per",
        ] {
            assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
        }
        let error = parse(&["run", "--help"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::DisplayHelp);
        assert!(error.render().to_string().contains("--log-refkey <KEY>"));
    }

    /// The options of `rbac generate ARGS...`.
    fn generate(args: &[&str]) -> Result<GenerateArgs, clap::Error> {
        let mut argv = vec!["rbac", "generate"];
        argv.extend_from_slice(args);
        match cli(&argv)?.command() {
            Command::Manifests(Manifests::Rbac(RbacCommand::Generate(args))) => Ok(args),
            other => panic!("not rbac generate: {other:?}"),
        }
    }

    #[test]
    fn rbac_commands_take_the_options_of_run_and_the_service_account() {
        let args = generate(&[
            "-n",
            "team-a",
            "--peering",
            "team",
            "--leader-election",
            "--service-account",
            "my-op",
            "--service-account-namespace",
            "ops",
            "-o",
            "rbac.yaml",
        ])
        .unwrap();
        assert_eq!(args.output, Some(PathBuf::from("rbac.yaml")));
        assert_eq!(
            args.rbac.run.scope(),
            Scope::Namespaces(vec!["team-a".into()])
        );
        assert_eq!(args.rbac.run.peering.as_deref(), Some("team"));
        assert!(args.rbac.run.leader_election);
        assert_eq!(args.rbac.service_account_name(), "my-op");
        assert_eq!(args.rbac.service_account_namespace(), "ops");

        let cli = cli(&["rbac", "verify", "-A", "-f", "-"]).unwrap();
        assert_eq!(cli.run_args().scope(), Scope::ClusterWide);
        assert_eq!(cli.run_args().scope_warning(), None);
        match cli.command() {
            Command::Manifests(Manifests::Rbac(RbacCommand::Verify(args))) => {
                assert_eq!(args.file, Some(PathBuf::from("-")));
            }
            other => panic!("not rbac verify: {other:?}"),
        }
    }

    #[test]
    fn the_service_account_defaults_to_the_programs_name() {
        let args = generate(&[]).unwrap();
        assert_eq!(args.output, None);
        assert_eq!(
            args.rbac.service_account_name(),
            program_name().unwrap_or_else(|| DEFAULT_NAME.to_string())
        );
    }

    #[test]
    fn rbac_and_crds_are_commands_and_rbac_needs_one_of_its_own() {
        assert_eq!(
            cli(&["crds"]).unwrap().command(),
            Command::Manifests(Manifests::Crds)
        );
        let error = cli(&["rbac"]).unwrap_err();
        assert_eq!(
            error.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        // `-n` with `-A` is a usage error for rbac too: the permissions depend on the scope.
        let error = generate(&["-n", "x", "-A"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
        let error = cli(&["crds", "-n", "x"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownArgument);
    }

    #[test]
    fn help_lists_the_commands_and_the_rbac_options() {
        let help = cli(&["--help"]).unwrap_err().render().to_string();
        for needle in ["run", "rbac", "crds", "manifests", "olm"] {
            assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
        }
        let help = generate(&["--help"]).unwrap_err().render().to_string();
        for needle in [
            "-o, --output <FILE>",
            "--service-account <NAME>",
            "--service-account-namespace <NS>",
            "KACTOR_SERVICE_ACCOUNT",
            "-n, --namespace <NS>",
            "--leader-election",
        ] {
            assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
        }
        let help = cli(&["rbac", "verify", "--help"])
            .unwrap_err()
            .render()
            .to_string();
        assert!(help.contains("-f, --filename <FILE>"), "{help}");
    }

    #[test]
    fn version_is_kactors() {
        let error = parse(&["--version"]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::DisplayVersion);
        assert!(error
            .render()
            .to_string()
            .contains(env!("CARGO_PKG_VERSION")));
    }
}

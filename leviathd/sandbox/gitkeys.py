"""Every git setting git knows, classified: does its value name a command git
runs (`COMMAND`), a file or folder git reads code or settings from (`PATH`),
or neither (`NEITHER`)? Issue 48: a reader of our own that lists "the
dangerous keys" misses some (`remote.<name>.uploadpack`,
`difftool.<tool>.cmd`, `core.gitProxy`, ...); here every key is in one of the
three, and tests/unit/test_git_keys.py fails when the installed git knows a
key (`git help --config`) that is in none. Gathered from git 2.39 (Debian
12), 2.47 (Debian 13) and git's master of 2026, plus the keys other git
commands document outside that list (`filter.<driver>.process`,
`diff.external`, `trailer.<key>.command`).

Keys are as `git config --list` prints them, lower case, a `<name>` part
written `*`. A key git does not know (a newer git, a tool's own) counts as a
command: the words of its value that name paths are protected, which costs a
mount and never lets code run.
"""

from __future__ import annotations

from typing import Literal

Kind = Literal["command", "path", "folder", "neither"]


def _keys(text: str) -> frozenset[str]:
    return frozenset(text.split())


# The value is a command line (or a tool's program): run by git or its tools.
COMMAND: frozenset[str] = _keys("""
    alias.* alias.*.command browser.*.cmd browser.*.path core.alternaterefscommand
    core.askpass core.editor core.fsmonitor core.gitproxy core.pager core.sshcommand
    credential.*.* credential.helper diff.*.command diff.*.textconv diff.external
    difftool.*.cmd difftool.*.path filter.*.clean filter.*.process filter.*.smudge
    gc.recentobjectshook gpg.*.program gpg.program gpg.ssh.defaultkeycommand guitool.*.cmd
    help.browser hook.*.command imap.tunnel instaweb.browser instaweb.httpd
    interactive.difffilter man.*.cmd man.*.path merge.*.driver mergetool.*.cmd
    mergetool.*.path pager.* remote.*.receivepack remote.*.uploadpack sendemail.*.*
    sendemail.cccmd sendemail.headercmd sendemail.smtpserver sendemail.tocmd sequence.editor
    submodule.*.update trailer.*.cmd trailer.*.command uploadpack.packobjectshook web.browser
""")

# The value is a file git reads settings or attributes from.
PATH: frozenset[str] = _keys("""
    include.path includeif.*.path core.attributesfile
""")

# The value is a folder git runs or copies code from, or reads a git folder from.
FOLDER: frozenset[str] = _keys("""
    core.hookspath init.templatedir instaweb.modulepath submodule.*.gitdir
""")

NEITHER: frozenset[str] = _keys("""
    add.ignoreerrors add.interactive.usebuiltin advice.* advice.addembeddedrepo
    advice.diverging advice.forcedeletebranch advice.mergeconflict advice.rebasetodoerror
    advice.refsyntax advice.sparseindexexpanded advice.submodulemergeconflict
    advice.worktreeaddorphan fsck.badreffiletype fsck.badrefname fsck.largepathname
    receive.fsck.badreffiletype receive.fsck.badrefname receive.fsck.largepathname
    advice.addemptypathspec advice.addignoredfile advice.ambiguousfetchrefspec advice.amworkdir
    advice.checkoutambiguousremotebranchname advice.commitbeforemerge advice.detachedhead
    advice.fetchshowforcedupdates advice.graftfiledeprecated advice.ignoredhook
    advice.implicitidentity advice.nestedtag advice.objectnamewarning advice.pushalreadyexists
    advice.pushfetchfirst advice.pushneedsforce advice.pushnonfastforward
    advice.pushnonffcurrent advice.pushnonffmatching advice.pushrefneedsupdate
    advice.pushunqualifiedrefname advice.pushupdaterejected advice.resetnorefresh
    advice.resolveconflict advice.rmhints advice.sequencerinuse advice.setupstreamfailure
    advice.skippedcherrypicks advice.statusaheadbehindwarning advice.statushints
    advice.statusuoption advice.submodulealternateerrorstrategydie advice.submodulesnotupdated
    advice.suggestdetachinghead advice.updatesparsepath advice.waitingforeditor am.keepcr
    am.threeway apply.ignorewhitespace apply.whitespace attr.tree author.email author.name
    bitmappseudomerge.*.decay bitmappseudomerge.*.maxmerges bitmappseudomerge.*.pattern
    bitmappseudomerge.*.samplerate bitmappseudomerge.*.stablesize
    bitmappseudomerge.*.stablethreshold bitmappseudomerge.*.threshold blame.blankboundary
    blame.coloring blame.date blame.ignorerevsfile blame.markignoredlines
    blame.markunblamablelines blame.showemail blame.showroot branch.*.description branch.*.merge
    branch.*.mergeoptions branch.*.pushremote branch.*.rebase branch.*.remote
    branch.autosetupmerge branch.autosetuprebase branch.sort bundle.* bundle.*.* bundle.*.uri
    bundle.heuristic bundle.mode bundle.version checkout.defaultremote checkout.guess
    checkout.thresholdforparallelism checkout.workers clean.requireforce clone.defaultremotename
    clone.filtersubmodules clone.rejectshallow color.advice color.advice.hint
    color.blame.highlightrecent color.blame.repeatedlines color.branch color.branch.*
    color.branch.current color.branch.local color.branch.plain color.branch.remote
    color.branch.reset color.branch.upstream color.branch.worktree color.decorate.*
    color.decorate.branch color.decorate.grafted color.decorate.head color.decorate.remotebranch
    color.decorate.stash color.decorate.tag color.diff color.diff.* color.diff.commit
    color.diff.context color.diff.contextbold color.diff.contextdimmed color.diff.frag
    color.diff.func color.diff.meta color.diff.new color.diff.newbold color.diff.newdimmed
    color.diff.newmoved color.diff.newmovedalternative color.diff.newmovedalternativedimmed
    color.diff.newmoveddimmed color.diff.old color.diff.oldbold color.diff.olddimmed
    color.diff.oldmoved color.diff.oldmovedalternative color.diff.oldmovedalternativedimmed
    color.diff.oldmoveddimmed color.diff.plain color.diff.whitespace color.grep color.grep.*
    color.grep.column color.grep.context color.grep.filename color.grep.function
    color.grep.linenumber color.grep.match color.grep.matchcontext color.grep.matchselected
    color.grep.selected color.grep.separator color.interactive color.interactive.*
    color.interactive.error color.interactive.header color.interactive.help
    color.interactive.plain color.interactive.prompt color.interactive.reset color.pager
    color.push color.push.error color.remote color.remote.* color.remote.error color.remote.hint
    color.remote.success color.remote.warning color.showbranch color.status color.status.*
    color.status.added color.status.branch color.status.changed color.status.header
    color.status.localbranch color.status.nobranch color.status.remotebranch
    color.status.unmerged color.status.untracked color.status.updated color.transport
    color.transport.rejected color.ui column.branch column.clean column.status column.tag
    column.ui commit.cleanup commit.gpgsign commit.status commit.template commit.verbose
    commitgraph.changedpaths commitgraph.changedpathsversion commitgraph.generationversion
    commitgraph.maxnewfilters commitgraph.readchangedpaths committer.email committer.name
    completion.commands core.abbrev core.alternaterefsprefixes core.autocrlf core.bare
    core.bigfilethreshold core.checkroundtripencoding core.checkstat core.commentchar
    core.commentstring core.commitgraph core.compression core.configlocktimeout
    core.createobject core.deltabasecachelimit core.eol core.excludesfile core.filemode
    core.filesreflocktimeout core.fsmonitorhookversion core.fsync core.fsyncmethod
    core.fsyncobjectfiles core.hidedotfiles core.ignorecase core.ignorestat core.lockfilepid
    core.logallrefupdates core.loosecompression core.maxtreedepth core.multipackindex
    core.notesref core.packedgitlimit core.packedgitwindowsize core.packedrefstimeout
    core.precomposeunicode core.prefersymlinkrefs core.preloadindex core.protecthfs
    core.protectntfs core.quotepath core.repositoryformatversion core.restrictinheritedhandles
    core.safecrlf core.sharedrepository core.sparsecheckout core.sparsecheckoutcone
    core.splitindex core.symlinks core.trustctime core.unsetenvvars core.untrackedcache
    core.usereplacerefs core.warnambiguousrefs core.whitespace core.worktree
    credential.interactive credential.protectprotocol credential.sanitizeprompt
    credential.usehttppath credential.username credentialcache.ignoresighup
    credentialstore.locktimeoutms diff.*.binary diff.*.cachetextconv diff.*.trustexitcode
    diff.*.wordregex diff.*.xfuncname diff.algorithm diff.autorefreshindex diff.colormoved
    diff.colormovedws diff.context diff.dirstat diff.dstprefix diff.guitool
    diff.ignoresubmodules diff.indentheuristic diff.interhunkcontext diff.mnemonicprefix
    diff.noprefix diff.orderfile diff.relative diff.renamelimit diff.renames diff.srcprefix
    diff.statgraphwidth diff.statnamewidth diff.submodule diff.suppressblankempty diff.tool
    diff.trustexitcode diff.wordregex diff.wserrorhighlight difftool.guidefault difftool.prompt
    difftool.trustexitcode extensions.* extensions.compatobjectformat extensions.objectformat
    extensions.refstorage extensions.worktreeconfig fastimport.unpacklimit feature.*
    feature.experimental feature.manyfiles fetch.all fetch.bundlecreationtoken fetch.bundleuri
    fetch.fsck.* fetch.fsck.skiplist fetch.fsckobjects fetch.negotiationalgorithm fetch.output
    fetch.parallel fetch.prune fetch.prunetags fetch.recursesubmodules fetch.showforcedupdates
    fetch.unpacklimit fetch.writecommitgraph format.attach format.cc format.commitlistformat
    format.coverfromdescription format.coverletter format.encodeemailheaders
    format.filenamemaxlength format.forceinbodyfrom format.from format.headers format.mboxrd
    format.noprefix format.notes format.numbered format.outputdirectory format.pretty
    format.signature format.signaturefile format.signoff format.subjectprefix format.suffix
    format.thread format.to format.useautobase fsck.* fsck.baddate fsck.baddateoverflow
    fsck.bademail fsck.badfilemode fsck.badname fsck.badobjectsha1 fsck.badparentsha1
    fsck.badtagname fsck.badtimezone fsck.badtree fsck.badtreesha1 fsck.badtype
    fsck.duplicateentries fsck.emptyname fsck.extraheaderentry fsck.fullpathname
    fsck.gitattributesblob fsck.gitattributeslarge fsck.gitattributeslinelength
    fsck.gitattributesmissing fsck.gitattributessymlink fsck.gitignoresymlink
    fsck.gitmodulesblob fsck.gitmoduleslarge fsck.gitmodulesmissing fsck.gitmodulesname
    fsck.gitmodulesparse fsck.gitmodulespath fsck.gitmodulessymlink fsck.gitmodulesupdate
    fsck.gitmodulesurl fsck.hasdot fsck.hasdotdot fsck.hasdotgit fsck.mailmapsymlink
    fsck.missingauthor fsck.missingcommitter fsck.missingemail fsck.missingnamebeforeemail
    fsck.missingobject fsck.missingspacebeforedate fsck.missingspacebeforeemail fsck.missingtag
    fsck.missingtagentry fsck.missingtaggerentry fsck.missingtree fsck.missingtype
    fsck.missingtypeentry fsck.multipleauthors fsck.nulincommit fsck.nulinheader fsck.nullsha1
    fsck.skiplist fsck.treenotsorted fsck.unknowntype fsck.unterminatedheader
    fsck.zeropaddeddate fsck.zeropaddedfilemode fsmonitor.allowremote fsmonitor.socketdir
    gc.*.reflogexpire gc.*.reflogexpireunreachable gc.aggressivedepth gc.aggressivewindow
    gc.auto gc.autodetach gc.autopacklimit gc.bigpackthreshold gc.cruftpacks gc.logexpiry
    gc.maxcruftsize gc.packrefs gc.pruneexpire gc.reflogexpire gc.reflogexpireunreachable
    gc.repackfilter gc.repackfilterto gc.rerereresolved gc.rerereunresolved
    gc.worktreepruneexpire gc.writecommitgraph gitcvs.allbinary gitcvs.commitmsgannotation
    gitcvs.dbdriver gitcvs.dbname gitcvs.dbpass gitcvs.dbtablenameprefix gitcvs.dbuser
    gitcvs.enabled gitcvs.logfile gitcvs.usecrlfattr gitweb.avatar gitweb.blame gitweb.category
    gitweb.description gitweb.grep gitweb.highlight gitweb.owner gitweb.patches gitweb.pickaxe
    gitweb.remote_heads gitweb.showsizes gitweb.snapshot gitweb.url gpg.format gpg.mintrustlevel
    gpg.ssh.allowedsignersfile gpg.ssh.revocationfile grep.column grep.extendedregexp
    grep.fallbacktonoindex grep.fullname grep.linenumber grep.patterntype grep.threads
    gui.blamehistoryctx gui.commitmsgwidth gui.copyblamethreshold gui.diffcontext
    gui.displayuntracked gui.encoding gui.fastcopyblame gui.gcwarning gui.matchtrackingbranch
    gui.newbranchtemplate gui.pruneduringfetch gui.spellingdictionary gui.trustmtime
    guitool.*.argprompt guitool.*.confirm guitool.*.needsfile guitool.*.noconsole
    guitool.*.norescan guitool.*.prompt guitool.*.revprompt guitool.*.revunmerged
    guitool.*.title help.autocorrect help.format help.htmlpath hook.*.enabled hook.*.event
    hook.*.jobs hook.*.parallel hook.jobs http.*.* http.cookiefile http.curloptresolve
    http.delegation http.emptyauth http.extraheader http.followredirects http.keepalivecount
    http.keepaliveidle http.keepaliveinterval http.lowspeedlimit http.lowspeedtime
    http.maxrequests http.maxretries http.maxretrytime http.minsessions http.noepsv
    http.pinnedpubkey http.postbuffer http.proactiveauth http.proxy http.proxyauthmethod
    http.proxysslcainfo http.proxysslcert http.proxysslcertpasswordprotected http.proxysslkey
    http.retryafter http.savecookies http.schannelcheckrevoke http.schannelusesslcainfo
    http.sslbackend http.sslcainfo http.sslcapath http.sslcert http.sslcertpasswordprotected
    http.sslcerttype http.sslcipherlist http.sslkey http.sslkeytype http.ssltry http.sslverify
    http.sslversion http.useragent http.version i18n.commitencoding i18n.logoutputencoding
    imap.authmethod imap.folder imap.host imap.pass imap.port imap.preformattedhtml
    imap.sslverify imap.user index.recordendofindexentries index.recordoffsettable
    index.skiphash index.sparse index.threads index.version init.defaultbranch
    init.defaultsubmodulepathconfig instaweb.local instaweb.port interactive.singlekey
    log.abbrevcommit log.date log.decorate log.diffmerges log.excludedecoration log.follow
    log.graphcolors log.initialdecorationset log.mailmap log.showroot log.showsignature
    lsrefs.unborn mailinfo.scissors mailmap.blob mailmap.file maintenance.*.enabled
    maintenance.*.schedule maintenance.auto maintenance.autodetach maintenance.commit-graph.auto
    maintenance.geometric-repack.auto maintenance.geometric-repack.splitfactor
    maintenance.incremental-repack.auto maintenance.loose-objects.auto
    maintenance.loose-objects.batchsize maintenance.reflog-expire.auto
    maintenance.rerere-gc.auto maintenance.strategy maintenance.worktree-prune.auto man.viewer
    merge.*.name merge.*.recursive merge.autostash merge.branchdesc merge.conflictstyle
    merge.defaulttoupstream merge.directoryrenames merge.ff merge.guitool merge.log
    merge.renamelimit merge.renames merge.renormalize merge.stat merge.suppressdest merge.tool
    merge.verbosity merge.verifysignatures mergetool.*.hideresolved mergetool.*.layout
    mergetool.*.trustexitcode mergetool.guidefault mergetool.hideresolved mergetool.keepbackup
    mergetool.keeptemporaries mergetool.meld.hasoutput mergetool.meld.useautomerge
    mergetool.prompt mergetool.vimdiff.layout mergetool.writetotemp notes.*.mergestrategy
    notes.displayref notes.mergestrategy notes.rewrite.* notes.rewritemode notes.rewriteref
    pack.allowpackreuse pack.compression pack.deltacachelimit pack.deltacachesize pack.depth
    pack.indexversion pack.island pack.islandcore pack.packsizelimit pack.preferbitmaptips
    pack.readreverseindex pack.threads pack.usebitmapboundarytraversal pack.usebitmaps
    pack.usepathwalk pack.usesparse pack.window pack.windowmemory pack.writebitmaphashcache
    pack.writebitmaplookuptable pack.writereverseindex pretty.* promisor.acceptfromserver
    promisor.acceptfromserverurl promisor.advertise promisor.checkfields promisor.quiet
    promisor.sendfields promisor.storefields protocol.*.allow protocol.allow protocol.version
    pull.autostash pull.ff pull.octopus pull.rebase pull.twohead push.autosetupremote
    push.default push.followtags push.gpgsign push.negotiate push.pushoption
    push.recursesubmodules push.usebitmaps push.useforceifincludes rebase.abbreviatecommands
    rebase.autosquash rebase.autostash rebase.backend rebase.forkpoint rebase.instructionformat
    rebase.maxlabellength rebase.missingcommitscheck rebase.rebasemerges
    rebase.reschedulefailedexec rebase.stat rebase.updaterefs receive.advertiseatomic
    receive.advertisepushoptions receive.autogc receive.certnonceseed receive.certnonceslop
    receive.denycurrentbranch receive.denydeletecurrent receive.denydeletes
    receive.denynonfastforwards receive.fsck.* receive.fsck.baddate receive.fsck.baddateoverflow
    receive.fsck.bademail receive.fsck.badfilemode receive.fsck.badname
    receive.fsck.badobjectsha1 receive.fsck.badparentsha1 receive.fsck.badtagname
    receive.fsck.badtimezone receive.fsck.badtree receive.fsck.badtreesha1 receive.fsck.badtype
    receive.fsck.duplicateentries receive.fsck.emptyname receive.fsck.extraheaderentry
    receive.fsck.fullpathname receive.fsck.gitattributesblob receive.fsck.gitattributeslarge
    receive.fsck.gitattributeslinelength receive.fsck.gitattributesmissing
    receive.fsck.gitattributessymlink receive.fsck.gitignoresymlink receive.fsck.gitmodulesblob
    receive.fsck.gitmoduleslarge receive.fsck.gitmodulesmissing receive.fsck.gitmodulesname
    receive.fsck.gitmodulesparse receive.fsck.gitmodulespath receive.fsck.gitmodulessymlink
    receive.fsck.gitmodulesupdate receive.fsck.gitmodulesurl receive.fsck.hasdot
    receive.fsck.hasdotdot receive.fsck.hasdotgit receive.fsck.mailmapsymlink
    receive.fsck.missingauthor receive.fsck.missingcommitter receive.fsck.missingemail
    receive.fsck.missingnamebeforeemail receive.fsck.missingobject
    receive.fsck.missingspacebeforedate receive.fsck.missingspacebeforeemail
    receive.fsck.missingtag receive.fsck.missingtagentry receive.fsck.missingtaggerentry
    receive.fsck.missingtree receive.fsck.missingtype receive.fsck.missingtypeentry
    receive.fsck.multipleauthors receive.fsck.nulincommit receive.fsck.nulinheader
    receive.fsck.nullsha1 receive.fsck.skiplist receive.fsck.treenotsorted
    receive.fsck.unknowntype receive.fsck.unterminatedheader receive.fsck.zeropaddeddate
    receive.fsck.zeropaddedfilemode receive.fsckobjects receive.hiderefs receive.keepalive
    receive.maxinputsize receive.procreceiverefs receive.shallowupdate receive.unpacklimit
    receive.updateserverinfo reftable.blocksize reftable.geometricfactor reftable.indexobjects
    reftable.locktimeout reftable.restartinterval remote.*.advertisedas remote.*.fetch
    remote.*.followremotehead remote.*.mirror remote.*.negotiationinclude
    remote.*.negotiationrestrict remote.*.partialclonefilter remote.*.promisor remote.*.proxy
    remote.*.proxyauthmethod remote.*.prune remote.*.prunetags remote.*.push remote.*.pushurl
    remote.*.serveroption remote.*.skipdefaultupdate remote.*.skipfetchall remote.*.tagopt
    remote.*.url remote.*.vcs remote.pushdefault remotes.* repack.cruftdepth repack.cruftthreads
    repack.cruftwindow repack.cruftwindowmemory repack.midxmustcontaincruft
    repack.midxnewlayerthreshold repack.midxsplitfactor repack.packkeptobjects
    repack.updateserverinfo repack.usedeltabaseoffset repack.usedeltaislands repack.writebitmaps
    replay.refaction rerere.autoupdate rerere.enabled revert.reference safe.barerepository
    safe.directory sendemail.aliasesfile sendemail.aliasfiletype sendemail.annotate
    sendemail.bcc sendemail.cc sendemail.chainreplyto sendemail.confirm sendemail.envelopesender
    sendemail.forbidsendmailvariables sendemail.from sendemail.identity sendemail.mailmap
    sendemail.mailmap.blob sendemail.mailmap.file sendemail.multiedit sendemail.signedoffbycc
    sendemail.smtpbatchsize sendemail.smtpdomain sendemail.smtpencryption sendemail.smtppass
    sendemail.smtprelogindelay sendemail.smtpserveroption sendemail.smtpserverport
    sendemail.smtpsslcertpath sendemail.smtpuser sendemail.suppresscc sendemail.suppressfrom
    sendemail.thread sendemail.to sendemail.transferencoding sendemail.validate
    sendemail.xmailer showbranch.default sideband.*.* sideband.allowcontrolcharacters
    sparse.expectfilesoutsideofpatterns splitindex.maxpercentchange splitindex.sharedindexexpire
    ssh.variant stash.showincludeuntracked stash.showpatch stash.showstat status.aheadbehind
    status.branch status.comparebranches status.displaycommentprefix status.relativepaths
    status.renamelimit status.renames status.short status.showstash status.showuntrackedfiles
    status.submodulesummary submodule.*.active submodule.*.branch
    submodule.*.fetchrecursesubmodules submodule.*.ignore submodule.*.url submodule.active
    submodule.alternateerrorstrategy submodule.alternatelocation submodule.fetchjobs
    submodule.propagatebranches submodule.recurse tag.forcesignannotated tag.gpgsign tag.sort
    tar.umask trace2.configparams trace2.destinationdebug trace2.envvars trace2.eventbrief
    trace2.eventnesting trace2.eventtarget trace2.maxfiles trace2.normalbrief
    trace2.normaltarget trace2.perfbrief trace2.perftarget transfer.advertiseobjectinfo
    transfer.advertisesid transfer.bundleuri transfer.credentialsinurl transfer.fsckobjects
    transfer.hiderefs transfer.unpacklimit uploadarchive.allowunreachable
    uploadpack.allowanysha1inwant uploadpack.allowfilter uploadpack.allowreachablesha1inwant
    uploadpack.allowrefinwant uploadpack.allowtipsha1inwant uploadpack.hiderefs
    uploadpack.keepalive uploadpackfilter.*.allow uploadpackfilter.allow
    uploadpackfilter.tree.maxdepth url.*.insteadof url.*.pushinsteadof user.email user.name
    user.signingkey user.useconfigonly versionsort.suffix worktree.guessremote
    filter.*.required trailer.separators trailer.where trailer.ifexists trailer.ifmissing
    trailer.*.key trailer.*.where trailer.*.ifexists trailer.*.ifmissing
""")


def pattern(documented: str) -> str:
    """A key as `git help --config` lists it (`remote.<name>.url`), as this
    table writes it (`remote.*.url`)."""
    out, depth = [], 0
    for c in documented:
        if c == "<":
            if depth == 0:
                out.append("*")
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(c)
    return "".join(out).lower()


def _candidates(key: str) -> list[str]:
    """The table entries that may classify `key` (section.[subsection.]name,
    as git prints it), most specific first."""
    section, _, rest = key.partition(".")
    section = section.lower()
    sub, dot, name = rest.rpartition(".")
    name = name.lower()
    out = []
    if dot:
        out += [f"{section}.{sub.lower()}.{name}", f"{section}.{sub.lower()}.*",
                f"{section}.*.{name}", f"{section}.*.*"]
    else:
        out.append(f"{section}.{name}")
    out.append(f"{section}.*")
    return out


def classify(key: str) -> Kind:
    """What the value of `key` names; a key the table does not know counts as
    a command (see the module's doc)."""
    for c in _candidates(key):
        if c in COMMAND:
            return "command"
        if c in PATH:
            return "path"
        if c in FOLDER:
            return "folder"
        if c in NEITHER:
            return "neither"
    return "command"


def known(documented: str) -> bool:
    """Whether a key as git documents it is in the table."""
    p = pattern(documented)
    return p in COMMAND or p in PATH or p in FOLDER or p in NEITHER
